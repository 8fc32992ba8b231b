"""``trainer.loggers=[...,wandb]``: the run's config, every step's metrics and the final metrics in a W&B run.

The run lives in ``<run_dir>/wandb/`` and is named after the run directory. Offline by default: nothing leaves the
machine until ``wandb sync <run_dir>/wandb/offline-run-*``; ``WANDB_MODE=online`` (and ``WANDB_API_KEY``) logs live.
``WANDB_PROJECT`` sets the project (default ``openmanus-rl``); W&B reads the other ``WANDB_*`` variables itself.
Settings (:class:`Kwargs`, checked before the run starts) go at ``trainer.tracker_kwargs.wandb.<name>`` and win
over the variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.run.metrics import config_tree, finite_numbers, logger_selected
from openmanus_rl_core.config.plugin_kwargs import tracker_settings

NAME = "wandb"
PROJECT = "openmanus-rl"


@dataclass
class Kwargs:
    """``trainer.tracker_kwargs.wandb``: null takes the ``WANDB_*`` variable, then the default named."""

    project: Optional[str] = None  # WANDB_PROJECT, else openmanus-rl
    entity: Optional[str] = None  # WANDB_ENTITY, else your default entity
    group: Optional[str] = None  # runs shown together (e.g. the seeds of one setting)
    mode: Optional[Literal["online", "offline", "disabled"]] = None  # WANDB_MODE, else offline


class WandbTracker:
    """One W&B run per training run (``None`` between runs)."""

    Kwargs = Kwargs

    def __init__(self) -> None:
        self.run = None

    @hookimpl
    def openmanus_rl_run_start(self, cfg: Any, run_dir: str) -> None:
        if not logger_selected(cfg, NAME):
            return
        import wandb

        kw = tracker_settings(cfg, NAME, Kwargs)
        self.run = wandb.init(project=kw.project or os.environ.get("WANDB_PROJECT", PROJECT), entity=kw.entity,
                              group=kw.group, name=Path(run_dir).name, dir=str(run_dir), config=config_tree(cfg),
                              mode=kw.mode or os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")

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
