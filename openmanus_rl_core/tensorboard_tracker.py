"""The ``tensorboard`` entry of ``trainer.loggers``, as a hook plugin: the run's config and hyper-parameters in
the TensorBoard folder the metrics logger writes scalars to (``<run_dir>/tensorboard``).

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
_runs: dict[str, dict] = {}  # run_dir -> the config's flat leaves, kept from run start to run end


def _writer(run_dir: str):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))


@hookimpl
def openmanus_rl_run_start(cfg: Any, run_dir: str) -> None:
    if not logger_selected(cfg, NAME):
        return
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(OmegaConf.create(config_tree(cfg)))
    with _writer(run_dir) as w:
        w.add_text("config", "```yaml\n" + text + "```", global_step=0)  # markdown: keeps the indentation
    _runs[str(run_dir)] = config_params(cfg)


@hookimpl
def openmanus_rl_run_end(run_dir: str, metrics: dict[str, float]) -> None:
    params = _runs.pop(str(run_dir), None)
    if params is None:
        return
    final = {f"final/{k}": v for k, v in finite_numbers(metrics).items()}
    with _writer(run_dir) as w:
        w.add_hparams(params, final, run_name=".")  # "." : the run's own folder, not a timestamped sub-folder
