"""Where a run starts: a fresh start, or the checkpoint it resumes from; an earlier run's history is never
overwritten (it is resumed, or moved under ``previous/``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

PREVIOUS_DIR = "previous"
# What a run leaves in its run directory that a fresh start would overwrite.
_HISTORY = ("checkpoints", "metrics.jsonl", "tensorboard", "config.json", "config_history.jsonl", "rewards.png")
# The run's own record (its settings and their recorded changes): kept when the run starts again from its beginning.
_RECORD = ("config.json", "config_history.jsonl")


def run_history(run_dir: Path, with_record: bool = True) -> str:
    """What of an earlier run ``run_dir`` holds (its checkpoints, its logged steps, and with ``with_record`` its
    config.json), in words; "" when nothing."""
    from openmanus_rl_core.checkpoint.store import list_checkpoints
    from openmanus_rl_core.run.metrics import read_metrics

    parts = []
    ckpts = list_checkpoints(run_dir)
    if ckpts:
        parts.append(f"checkpoints {', '.join(p.name for _, p in ckpts)}")
    steps = [r["step"] for r in read_metrics(run_dir) if isinstance(r.get("step"), int)]
    if steps:
        parts.append(f"metrics.jsonl with steps {min(steps)}..{max(steps)}")
    if with_record and (run_dir / "config.json").is_file():
        parts.append("config.json" + ("" if parts else " (started, no step completed)"))
    return "; ".join(parts)


def set_aside_history(run_dir: Path, why: str, log, keep: tuple[str, ...] = ()) -> Path | None:
    """Move an earlier run's checkpoints, metrics and TensorBoard logs (and its record, unless ``keep`` names it)
    to ``run_dir/previous/<time>/`` (nothing is deleted); the moved-to folder, or None when there was nothing to
    move."""
    history = run_history(run_dir, with_record="config.json" not in keep)
    moved = [name for name in _HISTORY if name not in keep and (run_dir / name).exists()]
    if not history or not moved:
        return None
    stem = run_dir / PREVIOUS_DIR / time.strftime("%Y%m%d-%H%M%S")
    dest, i = stem, 0
    while dest.exists():
        i += 1
        dest = stem.with_name(f"{stem.name}-{i}")
    dest.mkdir(parents=True)
    for name in moved:
        os.rename(run_dir / name, dest / name)
    log(f"{why}: the earlier {', '.join(moved)} moved to {dest}")
    return dest


def resume_point(run_dir: Path, resume: Any, log: Callable[[str], None]) -> tuple[Path | None, dict | None]:
    """``(checkpoint folder, its state)`` to resume from, or ``(None, None)`` to start fresh.

    ``auto``: the newest checkpoint of the run directory that verifies and loads (a refused one falls back to
    the one before, with a warning); ``never``: a fresh start; a path: that checkpoint (or a run directory's
    newest). Nothing of an earlier run is overwritten unasked: with checkpoints that all fail to load, auto
    stops with an error listing them; a fresh start over an earlier run's history needs ``never``, which moves
    that history under ``previous/``. ``auto`` into a run stopped before its first checkpoint starts that run
    again from its beginning: its logged steps move under ``previous/``, its record (config.json) stays.
    """
    from openmanus_rl_core.checkpoint.store import CheckpointError, load_latest_checkpoint, open_checkpoint

    mode = str(resume).lower() if resume is not None else "null"  # YAML turns true/false/null into non-strings
    start_over = (f"To start over anyway, use a new trainer.run_dir, or trainer.resume=never (the earlier "
                  f"checkpoints and metrics are then moved to {run_dir / PREVIOUS_DIR}/).")
    if mode in ("auto", "true"):
        try:
            found = load_latest_checkpoint(run_dir, warn=lambda m: log(f"WARNING: {m}"))
        except CheckpointError as exc:
            raise CheckpointError(f"trainer.resume=auto: {exc}\nNothing in {run_dir} was changed. "
                                  f"{start_over}") from None
        if found is not None:
            return found
        if (run_dir / "config.json").is_file():  # stopped before its first checkpoint: the same run, from its start
            log(f"trainer.resume=auto: {run_dir} holds no checkpoint; the run starts again from its beginning with "
                f"its own settings (config.json)")
            set_aside_history(run_dir, "starting again", log, keep=_RECORD)
        return None, None
    if mode == "never":
        set_aside_history(run_dir, "trainer.resume=never: starting fresh", log)
        return None, None
    if mode in ("null", "none", "false", ""):
        history = run_history(run_dir)
        if history:
            raise CheckpointError(f"trainer.run_dir={run_dir} already holds a run ({history}) and "
                                  f"trainer.resume is not set. Continue it with trainer.resume=auto. {start_over}")
        return None, None
    return open_checkpoint(str(resume))
