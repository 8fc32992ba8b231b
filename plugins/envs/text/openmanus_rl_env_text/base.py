"""Shared pieces of the text envs: the word list, action normalisation, task picking, episode bookkeeping."""

from __future__ import annotations

import random
from typing import Any, Sequence

from openmanus_rl_core.protocols import StepResult, as_text

VOCAB: tuple[str, ...] = (
    "apple", "bird", "blue", "book", "bread", "cake", "car", "cat", "chair", "cloud",
    "coin", "cup", "dog", "egg", "fish", "flag", "frog", "gold", "green", "hat",
    "horse", "house", "lamp", "leaf", "lion", "map", "milk", "moon", "mouse", "nest",
    "pen", "pig", "rain", "red", "ring", "road", "rock", "rose", "salt", "sand",
    "ship", "shoe", "sky", "snow", "sock", "star", "stone", "sun", "table", "tea",
    "tree", "wall", "water", "wind", "wolf", "wood", "bell", "drum", "kite", "bee",
)
"""60 short common lowercase words. None of them occurs in any env's fixed text (``box``, ``door``,
``open``, ``say``, ...), so a password can only be learned from the observation that reveals it."""

MAX_ACTION_CHARS = 256
"""Actions longer than this (after stripping) are never a known form; they are answered without being
scanned word by word, which keeps a multi-megabyte reply cheap."""

def normalize(action: Any) -> str:
    """``action`` stripped, lowercased, with each run of whitespace collapsed to one space.

    Returns ``""`` for an action longer than :data:`MAX_ACTION_CHARS` after stripping (no known form
    is that long), so callers treat it like any other unknown action.
    """
    text = as_text(action).strip()
    if len(text) > MAX_ACTION_CHARS:
        return ""
    return " ".join(text.split()).lower()


def check_words(words: Sequence[str] | None, vocab_size: int | None) -> tuple[str, ...]:
    """The env's word list: ``words`` (default :data:`VOCAB`), cut to its first ``vocab_size``."""
    out = tuple(VOCAB if words is None else words)
    if vocab_size is not None:
        if not 1 <= int(vocab_size) <= len(out):
            raise ValueError(f"vocab_size={vocab_size!r} must be between 1 and {len(out)} (the word list's length)")
        out = out[: int(vocab_size)]
    if not out:
        raise ValueError("words is empty: give at least one word")
    for w in out:
        if not isinstance(w, str) or not w or w != normalize(w) or " " in w:
            raise ValueError(f"word {w!r} must be one non-empty lowercase word without spaces")
    if len(set(out)) != len(out):
        raise ValueError(f"words has duplicates: {sorted(w for w in set(out) if out.count(w) > 1)}")
    return out


class TextEnv:
    """Base of the text envs: task picking, the done flag, and the answer to a step after the end.

    Subclasses set ``instruction`` and ``num_tasks`` and implement ``_start(task) -> str``,
    ``_step(action: str) -> StepResult`` (``action`` already normalised; must set ``self.done``)
    and ``oracle_action()``.

    A ``task_id`` is taken modulo ``num_tasks`` (so any int names a task); ``task_id=None`` draws one
    from ``seed`` (``None`` counts as seed 0, so every ``(task_id, seed)`` pair, ``None`` included,
    gives one fixed state).
    """

    instruction: str = ""
    num_tasks: int = 1

    def __init__(self) -> None:
        self.task: int | None = None
        self.done = True
        self.success = False
        self.steps = 0

    # ------------------------------------------------------------------------------------------------
    def pick_task(self, task_id: int | None, seed: int | None) -> int:
        if task_id is None:
            return random.Random(0 if seed is None else seed).randrange(self.num_tasks)
        try:
            return int(task_id) % self.num_tasks
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task_id={task_id!r} is not an int: pass an int in [0, {self.num_tasks}) or None") from exc

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        self.task = self.pick_task(task_id, seed)
        self.done = False
        self.success = False
        self.steps = 0
        return self._start(self.task)

    def step(self, action: str) -> StepResult:
        if self.task is None:
            return StepResult("No episode: call reset() first.", 0.0, True, {"invalid": True, "success": False})
        if self.done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True, "success": self.success})
        self.steps += 1
        result = self._step(normalize(action))
        result.reward = float(result.reward)
        result.info.setdefault("invalid", False)
        if result.done:
            self.done = True
            result.info["success"] = self.success
        return result

    def close(self) -> None:
        self.done = True

    # ------------------------------------------------------------------------------------------------
    def _start(self, task: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _step(self, action: str) -> StepResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def oracle_action(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError
