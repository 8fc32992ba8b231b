"""Built-in memories: what context the model sees at each turn (:class:`~openmanus_rl_core.protocols.Memory`).

=============  ==========================================================================  =================
name           the context before reply ``t``                                              training samples
=============  ==========================================================================  =================
``full``       system, task, then every reply and observation (token for token)            one per episode
``window``     system, task, then the last ``window`` turns (reply, observation)           one per turn
``summary``    system, task + a summary of the turns before the window, then the window    one per turn
=============  ==========================================================================  =================

The summary is written by a rule, not by the model: one line per turn ``<n>. <action> -> <the observation's first
line>``, the newest lines kept within ``max_chars`` (older ones counted, not shown). A summary the policy writes
itself would cost one more generate call per turn and train on text no reward judges.
"""

from __future__ import annotations

from collections.abc import Sequence

from openmanus_rl_core.protocols import PastTurn

__all__ = ["FullMemory", "WindowMemory", "SummaryMemory", "chat"]


def chat(system: str, task: str, turns: Sequence[PastTurn]) -> list[dict[str, str]]:
    """``[system, user(task), assistant(reply_0), user(obs_0), ...]`` over ``turns``."""
    out = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    for t in turns:
        out += [{"role": "assistant", "content": t.reply}, {"role": "user", "content": t.observation}]
    return out


def _window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an int >= 1 (turns shown after the task)")
    return window


class FullMemory:
    """The whole episode; the loop concatenates its tokens itself (one sample per episode)."""

    per_turn = False

    def messages(self, system: str, task: str, history: Sequence[PastTurn]) -> list[dict[str, str]]:
        return chat(system, task, history)


class WindowMemory:
    """The task plus the last ``window`` turns (verl-agent's history window)."""

    per_turn = True

    def __init__(self, window: int):
        self.window = _window(window)

    def messages(self, system: str, task: str, history: Sequence[PastTurn]) -> list[dict[str, str]]:
        return chat(system, task, history[-self.window:])


class SummaryMemory:
    """The task with a running summary of the turns before the window, then the last ``window`` turns."""

    per_turn = True

    def __init__(self, window: int, max_chars: int):
        self.window = _window(window)
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 0:
            raise ValueError(f"max_chars={max_chars!r}: must be an int >= 0 (characters of the summary)")
        self.max_chars = max_chars

    def summary(self, turns: Sequence[PastTurn]) -> str:
        """One line per turn, the newest kept, the whole text (head line and joining newlines included) within
        ``max_chars``; ``""`` for no turns, or when not even the note of hidden turns fits."""
        lines = [f"{i + 1}. {t.action.strip() or '(no action)'} -> {(t.observation.strip().splitlines() or [''])[0]}"
                 for i, t in enumerate(turns)]
        kept: list[str] = []
        used = -1  # n lines joined by n - 1 newlines
        for line in reversed(lines):
            if used + 1 + len(line) > self.max_chars:
                break
            kept.append(line)
            used += 1 + len(line)
        while kept and len(lines) > len(kept):
            # The note of hidden turns counts too: give up the oldest shown lines until it fits.
            head = f"({len(lines) - len(kept)} earlier turns not shown)"
            if used + 1 + len(head) <= self.max_chars:
                break
            used -= 1 + len(kept.pop())
        hidden = len(lines) - len(kept)
        head = [f"({hidden} earlier turns not shown)"] if hidden else []
        text = "\n".join(head + kept[::-1])
        return text if len(text) <= self.max_chars else ""

    def messages(self, system: str, task: str, history: Sequence[PastTurn]) -> list[dict[str, str]]:
        cut = max(0, len(history) - self.window)
        earlier = self.summary(history[:cut])
        shown = f"{task}\n\nEarlier turns:\n{earlier}" if earlier else task
        return chat(system, shown, history[cut:])
