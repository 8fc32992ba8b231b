"""The wandb tracker offline: the hooks of a run write a W&B offline run, read back here from its ``.wandb`` file
(the run's config, each step's metrics, the final summary); not selected, it writes nothing."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from openmanus_rl_core.config.loading import compose
from openmanus_rl_core.plugin.manager import make_plugin_manager
from openmanus_rl_core.testing import SMALL_RUN

HEADER = 7  # ":W&B", a 2-byte magic, a 1-byte version
BLOCK = 32 * 1024  # the LevelDB log layout W&B writes: records in 32 KiB blocks, each chunk with a 7-byte header


def read_records(path: Path) -> list:
    """The protobuf ``Record`` s of an offline run file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    records, pending, pos = [], b"", HEADER
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pending += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _items(items) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def _run(run_dir: Path, loggers: str, *settings: str) -> None:
    cfg = compose([f"trainer.loggers={loggers}", "actor.lr=0.003", "env=word_copy", *settings])
    pm = make_plugin_manager()
    pm.hook.openmanus_rl_run_start(cfg=cfg, run_dir=str(run_dir))
    pm.hook.openmanus_rl_step_end(step=1, metrics={"train/reward_mean": 0.25, "train/kl": float("nan")})
    pm.hook.openmanus_rl_step_end(step=2, metrics={"train/reward_mean": 0.5, "train/kl": 0.01})
    pm.hook.openmanus_rl_run_end(run_dir=str(run_dir), metrics={"train/reward_mean": 0.5, "val/success_rate": 0.75})
    # W&B's service process writes the run file: finish() once returned before the run record was on disk (a CI
    # run read the file without it). teardown() waits for the service to write everything and stop.
    import wandb

    wandb.teardown()


def test_an_offline_run_holds_the_config_the_steps_and_the_summary(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run-a"
    _run(run_dir, "[tensorboard,wandb]")
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1  # offline: written locally, nothing sent
    records = read_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "run-a" and run.project == "openmanus-rl"
    config = _items(run.config.update)  # the config W&B got at init travels in the run record
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update(_items(r.config.update))
    assert config["actor"]["lr"] == 0.003 and config["env"]["name"] == "word_copy"
    assert config["trainer"]["loggers"] == ["tensorboard", "wandb"]
    history = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    steps = [(h["_step"], h["train/reward_mean"], h.get("train/kl")) for h in history]
    assert steps == [(1, 0.25, None), (2, 0.5, 0.01)]  # the NaN is left out, as metrics.jsonl nulls it
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    assert summary["final/val/success_rate"] == 0.75 and summary["final/train/reward_mean"] == 0.5
    assert "exit" in kinds  # the run was finished


def test_its_settings_name_the_project_and_the_group(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-the-variable")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "run-c"
    _run(run_dir, "[wandb]", "trainer.tracker_kwargs.wandb.project=my-runs", "trainer.tracker_kwargs.wandb.group=g1",
         "trainer.tracker_kwargs.wandb.mode=offline")
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    run = next(r.run for r in read_records(path) if r.WhichOneof("record_type") == "run")
    assert (run.project, run.run_group) == ("my-runs", "g1")  # the setting wins over WANDB_PROJECT


def test_not_selected_it_writes_nothing(tmp_path):
    _run(tmp_path / "run-b", "[tensorboard]")
    assert not (tmp_path / "run-b" / "wandb").exists()


@pytest.mark.long  # the hooks' fast test above reads back what a real tracker wrote
@pytest.mark.slow
def test_a_training_run_logs_every_step_to_wandb_as_in_metrics_jsonl(tmp_path):
    """`openmanus-rl train trainer.loggers=[tensorboard,wandb]`: the trainer's own hooks feed the tracker."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "WANDB_SILENT": "true"}
    env.pop("WANDB_MODE", None)
    run_dir = tmp_path / "run"
    proc = subprocess.run(["openmanus-rl", "train", *SMALL_RUN, "trainer.loggers=[tensorboard,wandb]",
                           f"trainer.run_dir={run_dir}"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = read_records(path)
    history = {h["_step"]: h for h in (_items(r.history.item) for r in records
                                       if r.WhichOneof("record_type") == "history")}
    assert sorted(history) == [1, 2]
    for step in (1, 2):
        assert history[step]["train/reward_mean"] == pytest.approx(logged[step]["train/reward_mean"])
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert _items(run.config.update)["trainer"]["total_steps"] == 2
