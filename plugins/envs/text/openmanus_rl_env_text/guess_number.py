"""``guess_number``: find a hidden number in ``low..high`` from higher/lower feedback."""

from __future__ import annotations

import re

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_text.base import TextEnv

_NUMBER = re.compile(r"[0-9]{1,9}", re.ASCII)  # ASCII digits only: int() rejects some unicode "digits"


class GuessNumberEnv(TextEnv):
    """Guess the number.

    Task ``t``'s number is ``low + t`` (``num_tasks = high - low + 1``). The action is one number
    in ``low..high`` (ASCII digits, nothing else). A right guess: reward 1.0, done, success. A wrong
    one: ``"<n> is too low."`` / ``"<n> is too high."``, plus, with ``show_range`` (default), the
    interval still possible (``"Try 8 to 16."``), which makes each state readable from the last
    observation alone. Anything else is invalid (``info["invalid"]``), reward 0, not done.

    The oracle bisects the interval still possible: at most ``ceil(log2(n + 1))`` guesses (5 for
    1..16); the shipped config gives 6 turns.
    """

    def __init__(self, low: int = 1, high: int = 16, show_range: bool = True):
        super().__init__()
        self.low, self.high = int(low), int(high)
        if not 0 <= self.low < self.high <= 10**6:
            raise ValueError(f"low={low!r}, high={high!r}: need 0 <= low < high <= 1000000")
        self.show_range = bool(show_range)
        self.num_tasks = self.high - self.low + 1
        self.instruction = f"Find the hidden number. Reply with one number from {self.low} to {self.high}."
        self.target = self.lo = self.hi = self.low

    def _start(self, task: int) -> str:
        self.target = self.low + task
        self.lo, self.hi = self.low, self.high
        return f"Guess a number from {self.low} to {self.high}."

    def _step(self, action: str) -> StepResult:
        if not _NUMBER.fullmatch(action) or not self.low <= int(action) <= self.high:
            return StepResult(f"Say one number from {self.low} to {self.high}.", 0.0, False, {"invalid": True})
        n = int(action)
        if n == self.target:
            self.done = self.success = True
            return StepResult(f"Correct! It is {n}.", 1.0, True, {})
        if n < self.target:
            self.lo = max(self.lo, n + 1)
            text = f"{n} is too low."
        else:
            self.hi = min(self.hi, n - 1)
            text = f"{n} is too high."
        if self.show_range:
            text += f" Try {self.lo} to {self.hi}."
        return StepResult(text, 0.0, False, {})

    def oracle_action(self) -> str:
        return str((self.lo + self.hi) // 2)
