"""What a run prints while it works: the step bar of the fit loop.

:class:`ProgressBar`: a tqdm bar over training steps on a terminal, one plain line per step anywhere else.

The alive lines of the long phases before it: :mod:`openmanus_rl_core.process.alive`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

from openmanus_rl_core.run.metrics import flatten_metrics

__all__ = ["ProgressBar", "ConsoleLog", "FIRST_STREAM_STEP"]

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
        if _env_errors(metrics, "rollout"):
            parts["env_error"] = _env_errors(metrics, "rollout")
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
        """``step 3/60: reward 0.512, success 0.500, env_error 2/16, val reward 0.625 success 0.625, 1.42s`` (env_error
        only when some episodes ended so, of the step's and of its validation's; val only when this step validated;
        ``, first stream step: fastest groups`` appended when ``stream/first_batch`` is set)."""
        def num(key: str) -> str:
            v = metrics.get(key)
            return "n/a" if v is None else f"{float(v):.3f}"

        line = f"step {int(step)}/{self.total}: reward {num(self.reward_key)}, success {num(self.success_key)}"
        if _env_errors(metrics, "rollout"):
            line += f", env_error {_env_errors(metrics, 'rollout')}"
        if metrics.get("val/reward_mean") is not None:
            line += f", val reward {num('val/reward_mean')} success {num('val/success_rate')}"
            if _env_errors(metrics, "val"):
                line += f" env_error {_env_errors(metrics, 'val')}"
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


def _env_errors(metrics: Mapping[str, Any], prefix: str) -> str:
    """``"2/16"``: the episodes that ended as env_error (``<prefix>/termination/env_error``) of all of them (the
    training step's ``rollout/episodes``; a validation's sum of its terminations); "" when there are none."""
    errors = metrics.get(f"{prefix}/termination/env_error")
    if not errors:
        return ""
    total = metrics.get(f"{prefix}/episodes") if prefix == "rollout" else sum(
        float(v) for k, v in metrics.items() if k.startswith(f"{prefix}/termination/"))
    return f"{int(errors)}/{int(total)}" if total else f"{int(errors)}"


class ConsoleLog:
    """Console lines that do not break the progress bar."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)
