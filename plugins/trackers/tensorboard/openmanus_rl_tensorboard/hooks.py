"""``trainer.loggers=[tensorboard]`` (the default): the run's config and hyper-parameters in the TensorBoard folder
the metrics logger writes the scalars to (``<run_dir>/tensorboard``).

- run start: the composed config as YAML text (tag ``config``, TEXT tab);
- run end: the flat config leaves (:func:`~openmanus_rl_core.run.metrics.config_params`) against the final metrics
  that are numbers (HPARAMS tab), so runs compare by their settings.

Settings (:class:`Kwargs`) go at ``trainer.tracker_kwargs.tensorboard.<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.run.metrics import TENSORBOARD_DIR, config_params, config_tree, finite_numbers, logger_selected
from openmanus_rl_core.config.plugin_kwargs import tracker_settings

NAME = "tensorboard"


def _writer(run_dir: str):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))


@dataclass
class Kwargs:
    """``trainer.tracker_kwargs.tensorboard``."""

    config_text: bool = True  # the composed config as YAML text at run start (TEXT tab)
    hparams: bool = True  # the config's leaves against the final metrics at run end (HPARAMS tab)


class TensorBoardTracker:
    """The config's flat leaves of each selected run, kept from its start to its end (keyed by run directory)."""

    Kwargs = Kwargs

    def __init__(self) -> None:
        self.runs: dict[str, dict] = {}

    @hookimpl
    def openmanus_rl_run_start(self, cfg: Any, run_dir: str) -> None:
        if not logger_selected(cfg, NAME):
            return
        from omegaconf import OmegaConf

        kw = tracker_settings(cfg, NAME, Kwargs)
        if kw.config_text:
            text = OmegaConf.to_yaml(OmegaConf.create(config_tree(cfg)))
            with _writer(run_dir) as w:
                w.add_text("config", "```yaml\n" + text + "```", global_step=0)  # markdown: keeps the indentation
        if kw.hparams:
            self.runs[str(run_dir)] = config_params(cfg)

    @hookimpl
    def openmanus_rl_run_end(self, run_dir: str, metrics: dict[str, float]) -> None:
        params = self.runs.pop(str(run_dir), None)
        if params is None:
            return
        final = {f"final/{k}": v for k, v in finite_numbers(metrics).items()}
        with _writer(run_dir) as w:
            w.add_hparams(params, final, run_name=".")  # "." : the run's own folder, not a timestamped sub-folder


tracker = TensorBoardTracker()
