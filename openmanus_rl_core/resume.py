"""Where a run starts: a fresh start, or the checkpoint it resumes from; an earlier run's history is never
overwritten (it is resumed, or moved under ``previous/``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

PREVIOUS_DIR = "previous"
# What a run leaves in its run directory that a fresh start would overwrite.
_HISTORY = ("checkpoints", "metrics.jsonl", "tensorboard", "config.json", "rewards.png")


def run_history(run_dir: Path) -> str:
    """What of an earlier run ``run_dir`` holds (its checkpoints, its logged steps), in words; "" when nothing."""
    from openmanus_rl_core.checkpoint import list_checkpoints
    from openmanus_rl_core.metrics import read_metrics

    parts = []
    ckpts = list_checkpoints(run_dir)
    if ckpts:
        parts.append(f"checkpoints {', '.join(p.name for _, p in ckpts)}")
    steps = [r["step"] for r in read_metrics(run_dir) if isinstance(r.get("step"), int)]
    if steps:
        parts.append(f"metrics.jsonl with steps {min(steps)}..{max(steps)}")
    return "; ".join(parts)


def set_aside_history(run_dir: Path, why: str, log) -> Path | None:
    """Move an earlier run's checkpoints, metrics and TensorBoard logs to ``run_dir/previous/<time>/`` (nothing is
    deleted); the moved-to folder, or None when there was no history."""
    history = run_history(run_dir)
    if not history:
        return None
    stem = run_dir / PREVIOUS_DIR / time.strftime("%Y%m%d-%H%M%S")
    dest, i = stem, 0
    while dest.exists():
        i += 1
        dest = stem.with_name(f"{stem.name}-{i}")
    dest.mkdir(parents=True)
    for name in _HISTORY:
        if (run_dir / name).exists():
            os.rename(run_dir / name, dest / name)
    log(f"{why}: starting fresh; the earlier run's {history} moved to {dest}")
    return dest


def resume_point(run_dir: Path, resume: Any, log: Callable[[str], None]) -> tuple[Path | None, dict | None]:
    """``(checkpoint folder, its state)`` to resume from, or ``(None, None)`` to start fresh.

    ``auto``: the newest checkpoint of the run directory that verifies and loads (a refused one falls back to
    the one before, with a warning); ``never``: a fresh start; a path: that checkpoint (or a run directory's
    newest). Nothing of an earlier run is overwritten unasked: with checkpoints that all fail to load, auto
    stops with an error listing them; a fresh start over an earlier run's history needs ``never``, which moves
    that history under ``previous/``.
    """
    from openmanus_rl_core.checkpoint import CheckpointError, load_latest_checkpoint, open_checkpoint

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
        set_aside_history(run_dir, "trainer.resume=auto found no checkpoint", log)
        return None, None
    if mode == "never":
        set_aside_history(run_dir, "trainer.resume=never", log)
        return None, None
    if mode in ("null", "none", "false", ""):
        history = run_history(run_dir)
        if history:
            raise CheckpointError(f"trainer.run_dir={run_dir} already holds a run ({history}) and "
                                  f"trainer.resume is not set. Continue it with trainer.resume=auto. {start_over}")
        return None, None
    return open_checkpoint(str(resume))
