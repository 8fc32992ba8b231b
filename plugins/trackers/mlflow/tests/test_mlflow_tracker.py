"""The mlflow tracker on a local file store: the hooks of a run log params (the config), each step's metrics and
the final metrics, read back with MLflow's own client; not selected, it writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openmanus_rl_core.config.loading import compose
from openmanus_rl_core.plugin.manager import make_plugin_manager
from openmanus_rl_core.testing import SMALL_RUN


def _run(run_dir, loggers: str, *settings: str) -> None:
    cfg = compose([f"trainer.loggers={loggers}", "actor.lr=0.003", "env=word_copy", *settings])
    pm = make_plugin_manager()
    pm.hook.openmanus_rl_run_start(cfg=cfg, run_dir=str(run_dir))
    pm.hook.openmanus_rl_step_end(step=1, metrics={"train/reward_mean": 0.25, "train/kl": float("nan")})
    pm.hook.openmanus_rl_step_end(step=2, metrics={"train/reward_mean": 0.5, "train/kl": 0.01})
    pm.hook.openmanus_rl_run_end(run_dir=str(run_dir), metrics={"train/reward_mean": 0.5, "val/success_rate": 0.75})


def test_a_file_store_run_holds_the_params_the_steps_and_the_final_metrics(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run-a"
    _run(run_dir, "[tensorboard,mlflow]")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("openmanus-rl")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["actor.lr"] == "0.003" and params["env.name"] == "word_copy"
    assert json.loads(params["trainer.loggers"]) == ["tensorboard", "mlflow"]
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/reward_mean")]
    assert sorted(history) == [(1, 0.25), (2, 0.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/kl")] == [(2, 0.01)]
    assert run.data.metrics["final/val/success_rate"] == 0.75
    artifact = client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))
    assert json.loads(open(artifact).read())["actor"]["lr"] == 0.003


def test_its_settings_name_the_store_and_the_experiment(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-the-variable")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it with any file store one names
    store = (tmp_path / "store").as_uri()
    _run(tmp_path / "run-c", "[mlflow]", f"trainer.tracker_kwargs.mlflow.tracking_uri='{store}'",
         "trainer.tracker_kwargs.mlflow.experiment=my-runs")
    assert not (tmp_path / "run-c" / "mlruns").exists()
    experiment = MlflowClient(tracking_uri=store).get_experiment_by_name("my-runs")
    (run,) = MlflowClient(tracking_uri=store).search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-c"


def test_not_selected_it_writes_nothing(tmp_path):
    _run(tmp_path / "run-b", "[tensorboard]")
    assert not (tmp_path / "run-b" / "mlruns").exists()


@pytest.mark.long  # the hooks' fast test above reads back what a real tracker wrote
@pytest.mark.slow
def test_a_training_run_logs_every_step_to_mlflow_as_in_metrics_jsonl(tmp_path, monkeypatch):
    """`openmanus-rl train trainer.loggers=[tensorboard,mlflow]`: the trainer's own hooks feed the tracker."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the store the run wrote

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    run_dir = tmp_path / "run"
    proc = subprocess.run(["openmanus-rl", "train", *SMALL_RUN, "trainer.loggers=[tensorboard,mlflow]",
                           f"trainer.run_dir={run_dir}"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("openmanus-rl").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["trainer.total_steps"] == "2"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/reward_mean")}
    assert history == pytest.approx({s: logged[s]["train/reward_mean"] for s in (1, 2)})
