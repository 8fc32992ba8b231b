"""What a run prints while it works: the step bar of the fit loop, and the alive lines of the long phases before it.

:class:`ProgressBar`: a tqdm bar over training steps on a terminal, one plain line per step anywhere else.

:class:`Alive`: a long phase before the first training step (the tokenizer corpus, the model build, validation,
the warm-up) says at least every :data:`EVERY_S` seconds how far it got, so a run is never silent for long. One
:class:`Alive` per phase, logging through the log function the phase already gets (``trainer.log``)::

    building the tokenizer corpus: 120/480 episodes, 11s
    warm-up: 40/120 steps, loss 0.5300, 12s
    validation: 60 tasks, 20s
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from openmanus_rl_core.metrics import flatten_metrics

__all__ = ["EVERY_S", "Alive", "ProgressBar", "FIRST_STREAM_STEP"]

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


FIRST_STREAM_STEP = "first stream step: fastest groups"
"""What a step line adds when the step's metrics carry ``stream/first_batch`` (rollout/stream.py): the stream's first
batch after a start or resume holds the groups that finished first, so its reward jump is no collapse."""


def _is_terminal(file: Any) -> bool:
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class ProgressBar:
    """A tqdm bar over training steps whose postfix shows the latest reward and success rate.

    ``update(step, metrics)`` moves the bar to ``step`` and shows ``reward_key`` and
    ``success_key`` (plus the val numbers when the metrics carry them). When ``file`` (stderr) is not a terminal,
    or ``disable`` is set, there is no bar: each update prints :meth:`step_line` on ``lines`` (stdout) instead.
    """

    def __init__(self, total: int, initial: int = 0, desc: str = "train", reward_key: str = "train/reward_mean",
                 success_key: str = "train/success_rate", file=None, disable: bool | None = False,
                 log_path: str | Path | None = None, lines=None):
        from tqdm.auto import tqdm

        self.reward_key, self.success_key = reward_key, success_key
        self.total = int(total)
        self._file = file or sys.stderr
        # A redirected console would fill its file with the bar's carriage-return redraws (a notebook's widget
        # bar draws no text, so it stays).
        notebook = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)
        disable = disable or not (_is_terminal(self._file) or notebook)
        # Without the bar, one line per step on ``lines`` (stdout); with ``log_path``, the same lines in a text log
        # a person can read later (appended: a resumed run goes on in the same file).
        self._lines = (lines or sys.stdout) if disable else None
        self._log = open(log_path, "a") if log_path is not None else None
        self.bar = tqdm(total=int(total), initial=int(initial), desc=desc, file=self._file,
                        dynamic_ncols=True, disable=disable, unit="step")
        self._step = int(initial)
        self._val: dict[str, float] = {}

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:

        metrics = flatten_metrics(metrics or {})
        for k in ("val/reward_mean", "val/success_rate"):
            if metrics.get(k) is not None:
                self._val[k] = float(metrics[k])
        parts = {"step": str(int(step))}
        for label, key in (("reward", self.reward_key), ("success", self.success_key)):
            v = metrics.get(key)
            if v is not None:
                parts[label] = f"{float(v):.3f}"
        if "val/reward_mean" in self._val:
            parts["val_reward"] = f"{self._val['val/reward_mean']:.3f}"
        if "val/success_rate" in self._val:
            parts["val_success"] = f"{self._val['val/success_rate']:.3f}"
        if metrics.get("stream/first_batch"):
            parts["note"] = FIRST_STREAM_STEP
        self.bar.set_postfix(parts, refresh=False)
        self.bar.update(max(0, int(step) - self._step))
        self._step = max(self._step, int(step))
        line = self.step_line(step, metrics)
        for out in (self._lines, self._log):
            if out is not None:
                print(line, file=out, flush=True)

    def step_line(self, step: int, metrics: Mapping[str, Any]) -> str:
        """``step 3/60: reward 0.512, success 0.500, val reward 0.625 success 0.625, 1.42s`` (val only when this
        step validated; ``, first stream step: fastest groups`` appended when ``stream/first_batch`` is set)."""
        def num(key: str) -> str:
            v = metrics.get(key)
            return "n/a" if v is None else f"{float(v):.3f}"

        line = f"step {int(step)}/{self.total}: reward {num(self.reward_key)}, success {num(self.success_key)}"
        if metrics.get("val/reward_mean") is not None:
            line += f", val reward {num('val/reward_mean')} success {num('val/success_rate')}"
        if metrics.get("timing/step") is not None:
            line += f", {float(metrics['timing/step']):.2f}s"
        if metrics.get("stream/first_batch"):
            line += f", {FIRST_STREAM_STEP}"
        return line

    def write(self, message: str) -> None:
        """Print a line without breaking the bar."""
        self.bar.write(message, file=self._file)

    def close(self) -> None:
        self.bar.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
