"""``relay``: a long episode; every station shows a word, saying it moves the runner to the next station."""

from __future__ import annotations

import random
from typing import Sequence

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_text.base import TextEnv, check_words

SCENERY: tuple[str, ...] = (
    "The track bends past a row of old trees and a low stone wall.",
    "A crowd on the left cheers and waves small paper flags.",
    "The ground is wet here and the runner slows for a moment.",
    "A marshal in a yellow coat points along the path ahead.",
    "Wind from the hills carries the smell of cut grass.",
    "A wooden bridge crosses a narrow stream below the track.",
)
"""Filler sentences that make observations long, as real benchmarks' are (room descriptions, inventories)."""


class RelayEnv(TextEnv):
    """Pass ``length`` stations. Station ``k`` shows a word; ``say <word>`` moves on (reward ``1 / length``), anything
    else stays at the station (reward 0, ``info["invalid"]`` for a non-``say`` action). Done with success after the
    last station; ``length`` correct turns are needed, so an episode is as long as ``length`` at least.

    Task ``t`` fixes the word sequence (``random.Random(t)`` over ``words``); ``padding`` scenery sentences pad each
    observation. kwargs: ``length`` (stations, >= 1), ``padding`` (sentences, >= 0), ``num_tasks`` (distinct routes),
    ``words`` / ``vocab_size`` as in every text env.
    """

    instruction = "Run the relay: at each station, say the word it shows (action: say <word>)."

    def __init__(self, length: int, padding: int, num_tasks: int, words: Sequence[str] | None = None,
                 vocab_size: int | None = None):
        super().__init__()
        for key, value, low in (("length", length, 1), ("padding", padding, 0), ("num_tasks", num_tasks, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{key}={value!r}: must be an int >= {low}")
        self.length, self.padding, self.num_tasks = length, padding, num_tasks
        self.words = check_words(words, vocab_size)
        self.route: list[str] = []
        self.at = 0

    def _observation(self, lead: str) -> str:
        scenery = " ".join(SCENERY[(self.at + i) % len(SCENERY)] for i in range(self.padding))
        return (f"{lead} Station {self.at + 1} of {self.length}. {scenery} "
                f"The sign at this station shows the word: {self.route[self.at]}.").replace("  ", " ")

    def _start(self, task: int) -> str:
        rng = random.Random(task)
        self.route = [rng.choice(self.words) for _ in range(self.length)]
        self.at = 0
        return self._observation("The relay starts.")

    def _step(self, action: str) -> StepResult:
        verb, _, word = action.partition(" ")
        if verb != "say" or not word:
            return StepResult(self._observation("Say the word (say <word>)."), 0.0, False, {"invalid": True})
        if word != self.route[self.at]:
            return StepResult(self._observation(f"Wrong word {word!r}."), 0.0, False, {})
        self.at += 1
        if self.at == self.length:
            self.done = self.success = True
            return StepResult("You finished the relay.", 1.0 / self.length, True, {})
        return StepResult(self._observation("Correct, run on."), 1.0 / self.length, False, {})

    def oracle_action(self) -> str:
        return f"say {self.route[self.at]}"
