"""Resuming never destroys history: what `trainer.resume` does with a run directory that already holds a run.

These stop (or decide) before any model or Ray starts, so they run in seconds (the commands run ``cli.main`` in this
process); the fall-back of a real resume to the previous checkpoint is in test_trainer.py (it needs a trained
run)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from openmanus_rl_core.checkpoint.store import save_checkpoint

TRAIN = ["train", "env=key_door", "trainer.total_steps=1", "trainer.progress=false", "trainer.loggers=[]",
         "trainer.num_cpus=1", "trainer.num_workers=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
         "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
         "model.tiny.vocab_size=400", "data.train_batch_size=2", "algorithm.n=2", "env.train_tasks=4",
         "env.val_tasks=2", "warmup.steps=1", "rollout.max_new_tokens=4"]


def _earlier_run(run_dir: Path) -> dict[str, bytes]:
    """A run directory as a run that got to step 4 leaves it: its config.json, checkpoints 2 and 4, metrics for
    steps 0..4. Returns every file's bytes, to show later that nothing changed."""
    from openmanus_rl_core.config.loading import load

    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(load(TRAIN[1:])), default=str))
    for step in (2, 4):
        save_checkpoint(run_dir, step, {"model": {"w": torch.full((4,), float(step))}, "trainer": {"step": step}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/reward_mean": s / 10}) + "\n"
                                                   for s in range(5)))
    return _files(run_dir)


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _damage(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_auto_resume_with_every_checkpoint_damaged_stops_and_lists_each(tmp_path, command_here):
    run_dir = tmp_path / "run"
    _earlier_run(run_dir)
    _damage(run_dir / "checkpoints" / "step_000004" / "model.pt")
    (run_dir / "checkpoints" / "step_000002" / "trainer.pt").write_bytes(b"truncated")
    before = _files(run_dir)
    out = command_here([*TRAIN, f"trainer.run_dir={run_dir}", "trainer.resume=auto"])
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    err = out.stderr
    assert f"error: trainer.resume=auto: none of the 2 checkpoint(s) in {run_dir / 'checkpoints'} can be used:" in err
    assert "  step_000004: model.pt does not match its SHA-256 in the manifest (the file is damaged)" in err
    assert "  step_000002: trainer.pt has 9 bytes, the manifest says" in err
    assert f"Nothing in {run_dir} was changed. To start over anyway, use a new trainer.run_dir, or " \
           f"trainer.resume=never" in err
    assert "Traceback" not in err and "starting fresh" not in out.stdout
    after = _files(run_dir)
    assert after == before  # every checkpoint file, metrics.jsonl, config.json


def test_a_fresh_start_over_an_earlier_run_needs_an_explicit_choice(tmp_path, command_here):
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    out = command_here([*TRAIN, f"trainer.run_dir={run_dir}"])
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert (f"error: trainer.run_dir={run_dir} already holds a run (checkpoints step_000002, step_000004; "
            f"metrics.jsonl with steps 0..4; config.json) and trainer.resume is not set. Continue it with trainer.resume=auto. "
            f"To start over anyway") in out.stderr
    assert _files(run_dir) == before


def test_never_sets_the_earlier_history_and_record_aside(tmp_path):
    """never: the earlier checkpoints, metrics and config.json move to previous/<time>/, byte for byte."""
    from openmanus_rl_core.run.resume import resume_point

    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    printed: list[str] = []
    assert resume_point(run_dir, "never", printed.append) == (None, None)
    moved = list((run_dir / "previous").iterdir())
    assert len(moved) == 1
    assert _files(moved[0]) == before  # everything, unchanged, under previous/<time>/
    assert sorted(p.name for p in run_dir.iterdir()) == ["previous"]
    assert printed == [f"trainer.resume=never: starting fresh: the earlier checkpoints, metrics.jsonl, config.json "
                       f"moved to {moved[0]}"]


def test_auto_without_a_checkpoint_starts_the_run_again_and_keeps_its_record(tmp_path):
    """auto into a run killed before its first checkpoint: the steps it logged move to previous/<time>/ (they are
    played again), its config.json and config history stay where the resume reads them."""
    import shutil

    from openmanus_rl_core.run.resume import resume_point

    run_dir = tmp_path / "run"
    _earlier_run(run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "config_history.jsonl").write_text('{"step": 0, "changes": {}}\n')
    before = _files(run_dir)
    printed: list[str] = []
    assert resume_point(run_dir, "auto", printed.append) == (None, None)
    moved = list((run_dir / "previous").iterdir())
    assert _files(moved[0]) == {"metrics.jsonl": before["metrics.jsonl"]}
    assert {k: v for k, v in _files(run_dir).items() if not k.startswith("previous")} == {
        k: before[k] for k in ("config.json", "config_history.jsonl")}
    assert printed == [f"trainer.resume=auto: {run_dir} holds no checkpoint; the run starts again from its beginning "
                       f"with its own settings (config.json)",
                       f"starting again: the earlier metrics.jsonl moved to {moved[0]}"]


def test_a_run_folder_without_its_record_is_refused(tmp_path, command_here):
    """A folder with a run's checkpoints but no config.json: nothing says what experiment it was, so neither auto
    nor a checkpoint path resumes it under this version's defaults."""
    run_dir = tmp_path / "run"
    _earlier_run(run_dir)
    (run_dir / "config.json").unlink()
    before = _files(run_dir)
    for resume in ("auto", str(run_dir / "checkpoints" / "step_000004")):
        out = command_here([*TRAIN, f"trainer.run_dir={run_dir}", f"trainer.resume={resume}"])
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        assert out.stderr.splitlines() == [
            f"error: trainer.resume={resume}: {run_dir} holds a run's checkpoints or metrics but no config.json, so "
            f"its settings are unknown; give the run folder that holds config.json, or start a new run (another "
            f"trainer.run_dir)"]
    assert _files(run_dir) == before


def test_auto_into_a_folder_holding_only_metrics_is_exit_2_and_changes_nothing(tmp_path, command_here):
    """metrics.jsonl alone (a run whose config.json was lost before its first checkpoint): its settings are unknown,
    so auto neither starts it again nor sets its steps aside."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val/success_rate": 0.5}) + "\n"
                                                   for s in range(3)))
    before = _files(run_dir)
    out = command_here([*TRAIN, f"trainer.run_dir={run_dir}", "trainer.resume=auto"])
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.splitlines() == [
        f"error: trainer.resume=auto: {run_dir} holds a run's checkpoints or metrics but no config.json, so its "
        f"settings are unknown; give the run folder that holds config.json, or start a new run (another "
        f"trainer.run_dir)"]
    assert _files(run_dir) == before and sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize("value", ["true", "True"])
def test_trainer_resume_true_resumes_like_auto(tmp_path, value):
    """`trainer.resume=true` (YAML's boolean, which reaches the string field as "True") continues the run from its
    newest checkpoint, exactly as `trainer.resume=auto` does."""
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.run.resume import resume_point

    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    resume = load([f"trainer.resume={value}"]).trainer.resume
    printed: list[str] = []
    path, state = resume_point(run_dir, resume, printed.append)
    auto_path, auto_state = resume_point(run_dir, "auto", printed.append)
    assert path == auto_path == run_dir / "checkpoints" / "step_000004"
    assert state["trainer"] == auto_state["trainer"] == {"step": 4}
    assert torch.equal(state["model"]["w"], torch.full((4,), 4.0))
    assert _files(run_dir) == before and printed == []  # nothing set aside, nothing moved


def test_setting_history_aside_twice_in_the_same_second_keeps_both(tmp_path, monkeypatch):
    import time

    from openmanus_rl_core.run.resume import set_aside_history

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-120000")  # one and the same second
    run_dir = tmp_path / "run"
    first = _earlier_run(run_dir)
    a = set_aside_history(run_dir, "why", lambda m: None)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 7, "train/reward_mean": 0.7}) + "\n")
    second = {k: v for k, v in _files(run_dir).items() if not k.startswith("previous")}
    b = set_aside_history(run_dir, "why", lambda m: None)
    assert a == run_dir / "previous" / "20260101-120000" and b == run_dir / "previous" / "20260101-120000-1"
    assert _files(a) == first and _files(b) == second  # both histories, byte for byte
    assert sorted(p.name for p in (run_dir / "previous").iterdir()) == ["20260101-120000", "20260101-120000-1"]
