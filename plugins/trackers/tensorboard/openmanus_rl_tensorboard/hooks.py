"""``trainer.loggers=[tensorboard]`` (the default): the run's config and hyper-parameters in the TensorBoard folder
the metrics logger writes the scalars to (``<run_dir>/tensorboard``).

- run start: the composed config as YAML text (tag ``config``, TEXT tab);
- run end: the flat config leaves (:func:`~openmanus_rl_core.metrics.config_params`) against the final metrics
  that are numbers (HPARAMS tab), so runs compare by their settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.metrics import TENSORBOARD_DIR, config_params, config_tree, finite_numbers, logger_selected

NAME = "tensorboard"


def _writer(run_dir: str):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))


class TensorBoardTracker:
    """The config's flat leaves of each selected run, kept from its start to its end (keyed by run directory)."""

    def __init__(self) -> None:
        self.runs: dict[str, dict] = {}

    @hookimpl
    def openmanus_rl_run_start(self, cfg: Any, run_dir: str) -> None:
        if not logger_selected(cfg, NAME):
            return
        from omegaconf import OmegaConf

        text = OmegaConf.to_yaml(OmegaConf.create(config_tree(cfg)))
        with _writer(run_dir) as w:
            w.add_text("config", "```yaml\n" + text + "```", global_step=0)  # markdown: keeps the indentation
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
