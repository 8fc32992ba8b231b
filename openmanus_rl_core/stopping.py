"""Stopping a run on SIGTERM or Ctrl-C without losing its steps.

The first SIGTERM or SIGINT asks the fit loop to stop after the step in progress (before the first step, in the
untrained validation or the warm-up, it interrupts at once: there is nothing to save): the loop saves a checkpoint
when a step completed since the last save, prints the command that resumes, and the command exits with 128 + the
signal's number (143 for SIGTERM, 130 for Ctrl-C), so a scheduler sees a preempted job, not a finished one. A
second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
    """``requested``: the first signal's number (None until one came). Handlers are installed by :meth:`install`
    (the main thread only; after ``ray.init``, which sets its own SIGTERM handler) and put back by
    :meth:`restore`."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.requested: int | None = None
        # Before the step loop (validation of the untrained model, the warm-up) there is no step to finish or save:
        # the signal interrupts at once (KeyboardInterrupt). The loop sets this False and stops between steps.
        self.interrupt = True
        self._previous: dict[int, object] = {}

    def install(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:
            os._exit(128 + signum)  # the second signal: at once, as asked
        self.requested = signum
        if self.interrupt:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} before the first training step")
        self.log(f"{signal.Signals(signum).name}: stopping after the current step (a checkpoint is saved); send it "
                 f"again to exit at once")

    @property
    def exit_code(self) -> int:
        return 128 + int(self.requested or 0)
