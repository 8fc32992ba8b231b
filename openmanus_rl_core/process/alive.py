"""Alive lines: a long phase (the tokenizer corpus, the model build, validation, the warm-up) says at least every
:data:`EVERY_S` seconds how far it got, so a run is never silent for long. One :class:`Alive` per phase, logging
through the log function the phase already gets (``trainer.log``)::

    building the tokenizer corpus: 120/480 episodes, 11s
    warm-up: 40/120 steps, loss 0.5300, 12s
    validation: 60 tasks, 20s
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["EVERY_S", "Alive"]

EVERY_S = 10.0
"""The longest silence of a phase, in seconds. 0: a line at every update, and none while a call blocks (tests)."""


class Alive:
    """Throttled progress lines of one phase: ``"<what>: <done>/<total> <unit>, <note>, <elapsed>s"`` (the count
    left out when ``total`` is None, empty parts dropped).

    :meth:`update` records progress and logs a line when ``every_s`` (default :data:`EVERY_S`) passed since the
    last one. Used as a context manager, a ticker thread also logs the latest state every ``every_s`` while the
    phase waits on a call that reports nothing (workers playing validation episodes, the tokenizer trainer).
    :meth:`say` logs the phase's own line and restarts the count. ``log`` None: nothing is logged.
    """

    def __init__(self, log: Callable[[str], None] | None, what: str, total: int | None = None, unit: str = "",
                 note: str = "", every_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.log, self.what, self.total, self.unit, self.note = log, what, total, unit, note
        self.every_s = EVERY_S if every_s is None else float(every_s)
        self.clock = clock
        self.done = 0
        self.start = self.last = clock()
        self._lock = threading.Lock()  # the ticker and the phase's own thread log one line at a time
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self) -> str:
        count = self.unit if self.total is None else f"{self.done}/{self.total} {self.unit}".rstrip()
        parts = (count, self.note, f"{self.clock() - self.start:.0f}s")
        return f"{self.what}: " + ", ".join(p for p in parts if p)

    def update(self, done: int | None = None, note: str | None = None) -> None:
        """Progress so far (``done`` of ``total``; ``note``, e.g. the last loss); a line if one is due."""
        if done is not None:
            self.done = done
        if note is not None:
            self.note = note
        self._tick()

    def advance(self, n: int = 1) -> None:
        """``n`` more done."""
        self.update(self.done + n)

    def say(self, msg: str) -> None:
        """Log ``msg``, a line of the phase's own: the next progress line is due ``every_s`` after it."""
        with self._lock:
            self.last = self.clock()
            if self.log is not None:
                self.log(msg)

    def _tick(self) -> None:
        with self._lock:
            now = self.clock()
            if self.log is None or now - self.last < self.every_s:
                return
            self.last = now
            self.log(self.line())

    def _tick_until_done(self) -> None:
        while not self._stop.wait(min(self.every_s, 1.0)):
            self._tick()

    def __enter__(self) -> "Alive":
        if self.log is not None and self.every_s > 0:
            self._ticker = threading.Thread(target=self._tick_until_done, name="omrl-alive", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
