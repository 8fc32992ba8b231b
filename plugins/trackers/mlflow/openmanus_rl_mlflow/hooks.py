"""``trainer.loggers=[...,mlflow]``: the run's config as params (and ``config.json`` as an artifact), every step's
metrics and the final metrics in an MLflow run.

The store is ``MLFLOW_TRACKING_URI`` when set, else a local file store in ``<run_dir>/mlruns`` (``mlflow ui
--backend-store-uri <run_dir>/mlruns`` shows it); the experiment is ``MLFLOW_EXPERIMENT_NAME`` or
``openmanus-rl``, the run is named after the run directory. Settings (:class:`Kwargs`, checked before the run
starts) go at ``trainer.tracker_kwargs.mlflow.<name>`` and win over the variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.run.metrics import config_params, config_tree, finite_numbers, logger_selected
from openmanus_rl_core.config.plugin_kwargs import tracker_settings

NAME = "mlflow"
EXPERIMENT = "openmanus-rl"
STORE_DIR = "mlruns"


@dataclass
class Kwargs:
    """``trainer.tracker_kwargs.mlflow``: null takes the ``MLFLOW_*`` variable, then the default named."""

    tracking_uri: Optional[str] = None  # MLFLOW_TRACKING_URI, else a file store in <run_dir>/mlruns
    experiment: Optional[str] = None  # MLFLOW_EXPERIMENT_NAME, else openmanus-rl


class MlflowTracker:
    """One MLflow run per training run, logged through its own client (no global active-run state)."""

    Kwargs = Kwargs

    def __init__(self) -> None:
        self.client = None
        self.run_id: str | None = None

    @hookimpl
    def openmanus_rl_run_start(self, cfg: Any, run_dir: str) -> None:
        if not logger_selected(cfg, NAME):
            return
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        kw = tracker_settings(cfg, NAME, Kwargs)
        uri = kw.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(run_dir) / STORE_DIR).resolve().as_uri()
            # MLflow 3 keeps the file store working but asks for this opt-in; a database would need a server
            # or SQLAlchemy, which a run folder should not.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = kw.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=Path(run_dir).name).info.run_id
        params = [Param(k, str(v)) for k, v in config_params(cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_dict(self.run_id, config_tree(cfg), "config.json")

    @hookimpl
    def openmanus_rl_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if self.run_id is not None:
            self._log(metrics, int(step), "")

    @hookimpl
    def openmanus_rl_run_end(self, run_dir: str, metrics: dict[str, float]) -> None:
        if self.run_id is None:
            return
        self._log(metrics, 0, "final/")
        self.client.set_terminated(self.run_id)
        self.client, self.run_id = None, None

    def _log(self, metrics: dict[str, Any], step: int, prefix: str) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(prefix + k, v, now, step) for k, v in finite_numbers(metrics).items()]
        for i in range(0, len(rows), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=rows[i:i + 1000])


tracker = MlflowTracker()
