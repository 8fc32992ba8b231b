"""``trainer.loggers=[...,wandb]``: the run's config, every step's metrics and the final metrics in a W&B run.

The run lives in ``<run_dir>/wandb/`` and is named after the run directory. Offline by default: nothing leaves the
machine until ``wandb sync <run_dir>/wandb/offline-run-*``; ``WANDB_MODE=online`` (and ``WANDB_API_KEY``) logs live.
``WANDB_PROJECT`` sets the project (default ``openmanus-rl``); W&B reads the other ``WANDB_*`` variables itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.metrics import config_tree, finite_numbers, logger_selected

NAME = "wandb"
PROJECT = "openmanus-rl"


class WandbTracker:
    """One W&B run per training run (``None`` between runs)."""

    def __init__(self) -> None:
        self.run = None

    @hookimpl
    def openmanus_rl_run_start(self, cfg: Any, run_dir: str) -> None:
        if not logger_selected(cfg, NAME):
            return
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=Path(run_dir).name,
                              dir=str(run_dir), config=config_tree(cfg),
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")

    @hookimpl
    def openmanus_rl_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(finite_numbers(metrics), step=int(step))

    @hookimpl
    def openmanus_rl_run_end(self, run_dir: str, metrics: dict[str, float]) -> None:
        if self.run is None:
            return
        self.run.summary.update({f"final/{k}": v for k, v in finite_numbers(metrics).items()})
        self.run.finish()
        self.run = None


tracker = WandbTracker()
