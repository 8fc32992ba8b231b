"""``word_copy``: one step; the observation names a word and the action must be exactly that word."""

from __future__ import annotations

from typing import Sequence

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_text.base import TextEnv, check_words

PHRASINGS: tuple[str, ...] = ("Say: {word}", "Repeat: {word}", "Copy: {word}", "Type: {word}", "Echo: {word}")
"""Ways of asking; ``phrasings=k`` uses the first k of them."""


class WordCopyEnv(TextEnv):
    """Repeat one word.

    Task ``t`` asks for ``words[t % len(words)]`` in phrasing ``t // len(words)``, so
    ``num_tasks = len(words) * phrasings``. The action, stripped and lowercased, must equal the word:
    reward 1.0 and success, else 0.0. Always done after one step. An empty or multi-word action is
    also marked ``info["invalid"]``; a single wrong word is a valid, wrong answer.

    kwargs: ``words`` (default :data:`~openmanus_rl_env_text.base.VOCAB`), ``vocab_size`` (use the
    first N words), ``phrasings`` (1..5, default 1: a single short phrasing).
    """

    instruction = "Reply with the word you are asked to say."

    def __init__(self, words: Sequence[str] | None = None, vocab_size: int | None = None, phrasings: int = 1):
        super().__init__()
        self.words = check_words(words, vocab_size)
        if not 1 <= int(phrasings) <= len(PHRASINGS):
            raise ValueError(f"phrasings={phrasings!r} must be between 1 and {len(PHRASINGS)}")
        self.phrasings = PHRASINGS[: int(phrasings)]
        self.num_tasks = len(self.words) * len(self.phrasings)
        self.word = ""

    def _start(self, task: int) -> str:
        self.word = self.words[task % len(self.words)]
        return self.phrasings[task // len(self.words)].format(word=self.word)

    def _step(self, action: str) -> StepResult:
        self.done = True
        self.success = action == self.word
        if self.success:
            return StepResult("Correct.", 1.0, True, {})
        return StepResult("Wrong.", 0.0, True, {"invalid": action == "" or " " in action})

    def oracle_action(self) -> str:
        return self.word
