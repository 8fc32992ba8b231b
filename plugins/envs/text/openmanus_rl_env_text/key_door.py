"""``key_door``: ``open box`` shows a password that never appears in the first observation;
``say <password>`` opens the door. Success needs the observation the first action produced."""

from __future__ import annotations

from typing import Sequence

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_text.base import TextEnv, check_words

START = "A locked door and a closed box. Actions: open box, say <word>."
UNKNOWN = "Unknown action. Actions: open box, say <word>."


class KeyDoorEnv(TextEnv):
    """Open a box to read a password, then say it.

    Task ``t``'s password is ``words[t]`` (``num_tasks = len(words)``). Actions (stripped, lowercased,
    whitespace collapsed):

    - ``open box`` -> ``"The box is open. The note says: <password>."``, reward 0 (also when repeated).
    - ``say <password>`` -> reward 1.0, done, success.
    - ``say <other single word>`` -> ``"Wrong word. The door stays locked."``, reward 0, not done.
    - anything else (``say`` with zero or several words, other verbs, empty) -> unknown action,
      ``info["invalid"] = True``, reward 0, not done.

    Two steps suffice; the shipped config gives 4 turns. kwargs: ``words``, ``vocab_size`` as in
    ``word_copy``.
    """

    instruction = "Open the door. Actions: open box, say <word>."

    def __init__(self, words: Sequence[str] | None = None, vocab_size: int | None = None):
        super().__init__()
        self.words = check_words(words, vocab_size)
        self.num_tasks = len(self.words)
        self.password = ""
        self.box_open = False

    def _start(self, task: int) -> str:
        self.password = self.words[task]
        self.box_open = False
        return START

    def _step(self, action: str) -> StepResult:
        if action == "open box":
            self.box_open = True
            return StepResult(f"The box is open. The note says: {self.password}.", 0.0, False, {})
        verb, _, rest = action.partition(" ")
        if verb == "say" and rest and " " not in rest:
            if rest == self.password:
                self.done = self.success = True
                return StepResult("The door opens.", 1.0, True, {})
            return StepResult("Wrong word. The door stays locked.", 0.0, False, {})
        return StepResult(UNKNOWN, 0.0, False, {"invalid": True})

    def oracle_action(self) -> str:
        return f"say {self.password}" if self.box_open else "open box"
