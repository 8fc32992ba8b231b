"""Stopping a run on SIGTERM or Ctrl-C without losing its steps, within ``trainer.stop_grace_s``.

The first SIGTERM or SIGINT stops the run, whatever phase it is in:

- before the first step (the untrained validation, the warm-up) it interrupts at once: there is nothing to save;
- a rollout or a validation in progress is abandoned: the actor ranks' agent loops see their call cancelled
  between two turns or while they wait for env calls, and give up (:class:`Abandoned`). An abandoned step is not
  trained on and not logged, its tasks are drawn again on resume and the ranks' RNGs are put back, so the resumed
  run plays that step as an uninterrupted one would; a validation abandoned after its step keeps the step (logged
  without its ``val/*``);
- an update in progress (compute, with no env to wait for) is finished.

Then the fit loop saves a checkpoint when a step completed since the last save, the command prints how to resume
and exits with 128 + the signal's number (143 for SIGTERM, 130 for Ctrl-C), so a scheduler sees a preempted job,
not a finished one. If the process has not exited ``stop_grace_s`` seconds after the signal (an update longer than
that, an env call that cannot be left), it exits then without a new checkpoint: the newest one stands. A second
signal exits at once.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Abandoned(Exception):
    """A rollout or validation given up after a stop signal (nothing of it is trained on or logged)."""


class StopOnSignal:
    """``requested``: the first signal's number (None until one came). Handlers are installed by :meth:`install`
    (the main thread only; after ``ray.init``, which sets its own SIGTERM handler) and put back by
    :meth:`restore`; :meth:`disarm` cancels the exit deadline once the run has ended on its own terms.

    ``grace_s``: seconds from the first signal to the exit at the latest; ``hint``: the line that says how to
    continue, printed when the deadline is reached.
    """

    def __init__(self, log: Callable[[str], None], grace_s: float = float("inf"), hint: str = ""):
        self.log = log
        self.grace_s = float(grace_s)
        self.hint = hint
        self.requested: int | None = None
        # Before the step loop (validation of the untrained model, the warm-up) there is no step to finish or save:
        # the signal interrupts at once (KeyboardInterrupt). The loop sets this False and stops between steps.
        self.interrupt = True
        self.deferring = False  # inside deferred(): the signal is raised when the block ends
        self._previous: dict[int, object] = {}
        self._deadline: threading.Timer | None = None

    def install(self, hint: str = "") -> "StopOnSignal":
        """Handle the stop signals from now on; installing again (after ``ray.init`` took SIGTERM) keeps the
        handlers that were there first, for :meth:`restore`."""
        self.hint = hint or self.hint
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous.setdefault(s, signal.signal(s, self._handle))
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def disarm(self) -> None:
        """The run has ended (saved, shut down): no exit at the deadline (an in-process caller goes on)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:
            os._exit(128 + signum)  # the second signal: at once, as asked
        self.requested = signum
        if self.grace_s != float("inf"):
            self._deadline = threading.Timer(self.grace_s, self._overdue)
            self._deadline.daemon = True
            self._deadline.start()
        name = signal.Signals(signum).name
        if self.deferring:
            return
        if self.interrupt:
            raise KeyboardInterrupt(f"{name} before the first training step")
        self.log(f"{name}: stopping (a rollout or validation in progress is abandoned, an update is finished, then "
                 f"a checkpoint is saved; exit within {self.grace_s:g}s); send it again to exit at once")

    def _overdue(self) -> None:
        self.log(f"{signal.Signals(self.requested).name}: the run did not stop within trainer.stop_grace_s="
                 f"{self.grace_s:g}s; exiting without a new checkpoint (the newest one stands). {self.hint}".rstrip())
        os._exit(self.exit_code)

    def abandon_now(self) -> bool:
        """True once a stop signal came: a rollout or validation in progress gives up (see the module doc)."""
        return self.requested is not None

    @property
    def exit_code(self) -> int:
        return 128 + int(self.requested or 0)

    @contextmanager
    def deferred(self):
        """A block a stop must not cut in the middle (Ray's start: an interrupt raised inside an import can be
        swallowed, or leave a module half imported); a signal during it interrupts when the block ends."""
        before, self.deferring = self.deferring, True
        try:
            yield
        finally:
            self.deferring = before
        if not before and self.interrupt and self.requested is not None:
            raise KeyboardInterrupt(f"{signal.Signals(self.requested).name} before the first training step")

    @contextmanager
    def keeping(self, sampler: Any):
        """Runs the block; when it is abandoned, ``sampler`` is put back as it was (the step's tasks are drawn
        again by the resumed run)."""
        state = sampler.state_dict()
        try:
            yield
        except Abandoned:
            sampler.load_state_dict(state)
            raise

    def unless_stopped(self, fn: Callable[..., dict], *args: Any) -> dict:
        """``fn(*args)`` (a validation after a completed step), or ``{}`` when a stop signal came before or during
        it: the step stays, logged without what ``fn`` would have added."""
        if self.requested is None:
            try:
                return fn(*args)
            except Abandoned:
                pass
        self.log("validation skipped: the run is stopping")
        return {}


def cancelled_call() -> Callable[[], bool]:
    """In a Ray actor task: a check whether the driver cancelled the task (``ray.cancel``), for loops that give up
    between turns. Outside Ray: never."""
    try:
        import ray

        if not ray.is_initialized():  # before get_runtime_context(), which would start a Ray of its own
            return lambda: False
        ctx = ray.get_runtime_context()
        if ctx.worker.mode == ray._private.worker.WORKER_MODE:
            return ctx.is_canceled
    except Exception:  # no Ray, or an old one without is_canceled
        pass
    return lambda: False
