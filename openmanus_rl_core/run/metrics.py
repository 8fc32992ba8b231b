"""Run directory, metrics (``metrics.jsonl`` + TensorBoard), the reward plot and timers (the progress bar:
:mod:`openmanus_rl_core.run.progress`).

``metrics.jsonl`` holds one JSON object per logged step: ``{"step": 12, "train/reward_mean": 0.5,
...}``. Every value is a float; NaN and +-inf are written as ``null`` (JSON has no NaN). Nested
dicts are flattened with ``/`` (``{"timing": {"gen": 1.0}}`` -> ``"timing/gen"``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from openmanus_rl_core.atomic import write_atomic

__all__ = [
    "MetricsLogger",
    "read_metrics",
    "plot_rewards",
    "Timer",
    "reduce_metrics",
    "flatten_metrics",
    "make_run_dir",
    "LearningSignalWatch",
    "logger_selected",
    "config_params",
    "config_tree",
    "finite_numbers",
]

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
PLOT_FILE = "rewards.png"


def mean(xs: Sequence[float]) -> float:
    """The mean of ``xs`` (NaN when empty)."""
    xs = [float(x) for x in xs]
    return float(sum(xs) / len(xs)) if xs else float("nan")


def success_interval(successes: Sequence[bool], z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% at the default ``z``): valid at 0 and at n successes,
    where the normal approximation collapses to a point. ``(nan, nan)`` for no episodes."""
    n = len(successes)
    if not n:
        return float("nan"), float("nan")
    p = sum(bool(s) for s in successes) / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _to_float(value: Any, key: str) -> float | None:
    """A metric value as a float, or None for NaN/inf. Tensors and numpy scalars must hold one number."""
    if hasattr(value, "item") and callable(value.item):  # torch tensor, numpy scalar/array of one element
        try:
            value = value.item()
        except (ValueError, RuntimeError) as exc:
            raise TypeError(f"metric {key!r}: {exc}; log a single number (reduce it first, e.g. .mean())") from None
    if isinstance(value, (bool, int, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None:
        return None
    raise TypeError(f"metric {key!r} = {value!r} ({type(value).__name__}) is not a number; metrics are floats")


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten_metrics(v, key))
        else:
            out[key] = v
    return out


class MetricsLogger:
    """Appends one line per step to ``<run_dir>/metrics.jsonl``; mirrors scalars to TensorBoard.

    ``resume_step``: on a resumed run, lines with ``step > resume_step`` (logged after the
    checkpoint the run resumes from) are dropped first, so the file never holds a step twice.
    A line cut short by a kill is dropped as well.
    """

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = True, resume_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._repair(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported here: it takes a second to load

            self._writer = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR))

    def _repair(self, resume_step: int | None) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_text(encoding="utf-8")
        lines = raw.splitlines()
        keep = []
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run
            if resume_step is None or rec.get("step", -1) <= resume_step:
                keep.append(line)
        if len(keep) != len(lines) or (raw and not raw.endswith("\n")):
            write_atomic(self.path, "".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float | None]:
        """Write ``metrics`` for ``step``; returns the record as written (without ``step``)."""
        flat = flatten_metrics(metrics)
        record = {k: _to_float(v, k) for k, v in flat.items() if k != "step"}
        self._file.write(json.dumps({"step": int(step), **record}, allow_nan=False) + "\n")
        self._file.flush()  # a kill -9 loses nothing already logged
        if self._writer is not None:
            for k, v in record.items():
                if v is not None:
                    self._writer.add_scalar(k, v, global_step=int(step))
        return record

    def flush(self) -> None:
        self._file.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of ``<run_dir>/metrics.jsonl`` (or of that file itself), skipping torn lines."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    records = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def reward_series(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, list, list, str, str | None]]:
    """What :func:`plot_rewards` draws: ``(label, steps, values, line style, marker)`` per curve.

    ``train/reward_mean`` (line), ``val/reward_mean`` and ``val/success_rate`` (markers) by step, then each reward
    component's weighted mean (``train/reward/<label>/mean``, dotted). A warm-up is its
    own segment at step 0, from the untrained validation (``val/*`` at step 0) up to the validation after the
    warm-up (``warmup/val/*``), where the RL curves start: the plot credits the warm-up's gain to the warm-up.
    """
    start = next((r for r in records if r.get("step") == 0), {})
    out = []
    for key, label, style, marker in (("train/reward_mean", "train reward", "-", None),
                                      ("val/reward_mean", "val reward", "-", "o"),
                                      ("val/success_rate", "val success rate", "--", "s")):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
        after = start.get("warmup/" + key)
        if after is not None:
            before = [y for x, y in pts if x == 0]
            if before:
                out.append((f"warm-up ({label.split(' ', 1)[1]})", [0, 0], [before[0], after], ":", "x"))
            pts = [(0, after)] + [(x, y) for x, y in pts if x != 0]
        if pts:
            out.append((label, [x for x, _ in pts], [y for _, y in pts], style, marker))
    # Each reward component's weighted contribution (train/reward/<label>/mean), thin and dotted under the totals.
    components = sorted({k.split("/")[2] for r in records for k in r
                         if k.startswith("train/reward/") and k.endswith("/mean") and k.count("/") == 3})
    for label in components:
        key = f"train/reward/{label}/mean"
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
        out.append((f"train {label}", [x for x, _ in pts], [y for _, y in pts], ":", None))
    return out


def plot_rewards(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """PNG of :func:`reward_series` with integer step ticks, written to ``<run_dir>/rewards.png`` unless ``out`` is
    given; returns the path. Drawn with matplotlib's Agg canvas (no display, no pyplot global state)."""
    path = Path(out) if out is not None else Path(run_dir) / PLOT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    reward_figure(run_dir).savefig(path, format="png", bbox_inches="tight")  # the legend sits outside the axes
    return path


def reward_figure(run_dir: str | os.PathLike):
    """The matplotlib figure :func:`plot_rewards` saves."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    fig = Figure(figsize=(9, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    series = reward_series(read_metrics(run_dir))
    for label, xs, ys, style, marker in series:
        warm = label.startswith("warm-up")
        ax.plot(xs, ys, linestyle=style, marker=marker, markersize=4, label=label,
                **({"color": "grey", "linewidth": 2} if warm else {}))
    if series:  # right of the axes: inside, with a curve per component, it hides the curves
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")
    else:
        ax.text(0.5, 0.5, "no reward metrics logged yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("reward / success rate")
    ax.set_title(run_dir.name)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


class Timer:
    """Wall-clock time per phase, reported as ``timing/<phase>`` seconds.

    ::

        timer = Timer()
        with timer("rollout"):
            ...
        with timer("update"):
            ...
        metrics.update(timer.metrics())   # {"timing/rollout": 1.2, "timing/update": 0.8}
        timer.reset()

    A phase entered several times accumulates. ``Timer(into=metrics_dict)`` also writes each
    phase's running total into that dict as it ends. On GPU, pass ``cuda_sync=True`` so queued
    kernels are counted in the phase that launched them.
    """

    def __init__(self, into: dict | None = None, cuda_sync: bool = False):
        self.timings: dict[str, float] = defaultdict(float)
        self.into = into
        self.cuda_sync = cuda_sync

    def _sync(self) -> None:
        if self.cuda_sync:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.timings[phase] += time.perf_counter() - start
            if self.into is not None:
                self.into[f"timing/{phase}"] = self.timings[phase]

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.timings.items()}

    def reset(self) -> None:
        self.timings.clear()


class LearningSignalWatch:
    """Says so, loudly, when a run learns nothing: every sample's advantage was 0 for ``patience`` steps in a row.

    Group-based estimators (GRPO, RLOO, GiGPO) learn only from reward differences within a group, so a reward
    that is the same for every sample (stuck at 0, a broken scorer, an env that always fails) gives zero
    advantages and an update that changes nothing, while the run looks healthy. ``update(step, metrics)`` reads
    ``train/zero_adv_frac`` (the fraction of samples whose advantages are all 0) and returns a warning to print
    when the streak reaches ``patience`` (once per streak; ``patience <= 0`` turns the watch off). The warning
    names the reward's mean and spread and each component's mean, which is where the cause usually shows.
    ``warmup_hint``: whether to suggest the supervised warm-up (only when it can run: the env has an oracle or the
    task files carry demonstrations).
    """

    def __init__(self, patience: int = 3, warmup_hint: bool = True):
        self.patience = int(patience)
        self.warmup_hint = bool(warmup_hint)
        self.streak = 0

    def update(self, step: int, metrics: Mapping[str, Any]) -> str | None:
        frac = metrics.get("train/zero_adv_frac")
        if self.patience <= 0 or frac is None:
            return None
        self.streak = self.streak + 1 if float(frac) >= 1.0 else 0
        if self.streak != self.patience:
            return None
        parts = [f"{k[len('train/reward/'):-len('/mean')]} {float(v):.3f}" for k, v in sorted(metrics.items())
                 if k.startswith("train/reward/") and k.endswith("/mean")]
        mean, std = (float(metrics.get(f"train/reward_{k}", float("nan"))) for k in ("mean", "std"))
        return (f"WARNING: no learning signal for {self.streak} steps (up to step {step}): every sample's advantage "
                f"is 0, so the updates change nothing. Rewards: mean {mean:.3f}, std {std:.3f}"
                + (f"; components (mean): {', '.join(parts)}" if parts else "")
                + ". Group estimators learn from reward differences within a group: check the reward components, "
                "raise rollout.n or rollout.temperature, or start from a better policy"
                + (" (warmup.enabled=true)." if self.warmup_hint else " (model.path=<a stronger model>)."))


def reduce_metrics(items: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per key, the mean over the dicts that have it (None and NaN values ignored; all-missing -> NaN).

    ``[{"a": 1, "b": 2}, {"a": 3}] -> {"a": 2.0, "b": 2.0}``. Tensors/numpy scalars are read with ``.item()``.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for item in items:
        for k, v in flatten_metrics(item).items():
            f = _to_float(v, k)
            sums.setdefault(k, 0.0)
            counts.setdefault(k, 0)
            if f is not None:
                sums[k] += f
                counts[k] += 1
    return {k: (sums[k] / counts[k] if counts[k] else float("nan")) for k in sums}




def dated_dir(base: str | os.PathLike, name: str, now: _dt.datetime | None = None) -> Path:
    """A new folder ``<base>/<YYYY-MM-DD>/<HH-MM-SS>-<name>`` (``-1``, ``-2``... appended when two start in the same
    second): where every command's outputs go, named the same way (runs by env, rollouts ``rollout-<env>``)."""
    now = now or _dt.datetime.now()
    safe = name.replace("/", "_").replace(":", "_")
    stem = Path(base).expanduser() / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}-{safe}"
    path, i = stem, 0
    while True:  # mkdir without exist_ok: two starts in the same second get distinct folders
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            i += 1
            path = stem.with_name(f"{stem.name}-{i}")


def logger_selected(cfg: Any, name: str) -> bool:
    """Whether ``trainer.loggers`` names the tracker ``name`` (``cfg``: the composed config a hook receives)."""
    return name in list(cfg.trainer.loggers or [])


def finite_numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` as floats, for a tracker (a NaN or inf is left out, as ``metrics.jsonl``
    writes it as null)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def config_tree(cfg: Any) -> dict:
    """The config a hook receives (a composed DictConfig, or the typed :class:`~openmanus_rl_core.config.schema.Config`)
    as plain nested dicts, interpolations resolved."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)


def config_params(cfg: Any) -> dict[str, str | int | float | bool]:
    """The config as flat ``{"actor.lr": 0.0005, ...}`` leaves for a tracker's hyper-parameter table: numbers,
    bools and strings kept, ``None`` and lists as JSON text."""
    out: dict[str, str | int | float | bool] = {}

    def walk(node: Mapping, prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping) and v:
                walk(v, key + ".")
            else:
                out[key] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
    walk(config_tree(cfg), "")
    return out


def make_run_dir(cfg: Any, now: _dt.datetime | None = None, announce: bool = True) -> Path:
    """Create and return the run directory, and print it.

    ``cfg.trainer.run_dir`` when set (resuming reuses it), else a new :func:`dated_dir` named after the env under
    ``cfg.trainer.output_dir``.
    """
    if cfg.trainer.run_dir:
        path = Path(cfg.trainer.run_dir).expanduser()
    else:
        path = dated_dir(cfg.trainer.output_dir, cfg.env.name, now)
    path.mkdir(parents=True, exist_ok=True)
    path = path.resolve()
    if announce:
        print(f"run directory: {path}", flush=True)
    return path


def perf_metrics(batch: Any, timings: dict[str, float]) -> dict[str, float]:
    """A step's throughput: every token it processed (prompts + responses, no padding), generated tokens, samples."""
    step_s = timings["step"]
    return {"perf/tokens_per_s": float(batch["attention_mask"].sum()) / step_s if step_s > 0 else float("nan"),
            "perf/gen_tokens_per_s": float(batch["response_mask"].sum()) / max(timings.get("rollout", 0.0), 1e-9),
            "perf/samples_per_s": len(batch) / step_s if step_s > 0 else float("nan"),
            "perf/samples": float(len(batch))}
