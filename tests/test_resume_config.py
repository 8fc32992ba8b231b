"""A resumed run continues its own experiment: its saved settings are the base, the command line's changes go on
top, are printed and recorded with their step; config.json is never rewritten; a change the checkpoint cannot
continue under is refused.

The first tests compose only (``--cfg job``, seconds); the last ones train for real (a tiny model, a few steps). The
commands run the console script's function (``cli.main``) in this process, the training ones on the tests' shared
Ray."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.config.loading import load

SMALL = ["env=key_door", "trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=1",
         "trainer.num_workers=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
         "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
         "data.train_batch_size=2", "algorithm.n=2", "env.train_tasks=4", "env.val_tasks=2", "warmup.steps=1",
         "rollout.max_new_tokens=4"]


def _earlier_run(run_dir: Path, overrides: list[str]) -> bytes:
    """A run folder as a run started with ``overrides`` leaves it (its config.json and a checkpoint folder)."""
    (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    record = json.dumps(dataclasses.asdict(load(overrides)), indent=2, default=str).encode()
    (run_dir / "config.json").write_bytes(record)
    return record


def _composed(args: list[str], command_here) -> dict:
    out = command_here(["train", *args, "--cfg", "job"])
    assert out.returncode == 0, out.stderr[-2000:]
    return yaml.safe_load(out.stdout)


def test_resume_without_the_original_overrides_keeps_the_runs_settings(tmp_path, command_here):
    run = tmp_path / "run"
    _earlier_run(run, ["reward=process", "allocator=per_turn", "actor.lr=3e-4", "env=guess_number"])
    cfg = _composed([f"trainer.run_dir={run}", "trainer.resume=auto"], command_here)
    assert list(cfg["reward"]["components"]) == ["process"]
    assert cfg["allocator"]["name"] == "per_turn" and cfg["actor"]["lr"] == 3e-4
    assert cfg["env"]["name"] == "guess_number"
    # Without trainer.resume the same command line is a fresh start with this version's defaults.
    fresh = _composed([f"trainer.run_dir={tmp_path / 'other'}"], command_here)
    assert list(fresh["reward"]["components"]) != ["process"] and fresh["env"]["name"] == "key_door"


def test_the_command_line_goes_on_top_and_a_group_option_replaces_its_section(tmp_path, command_here):
    run = tmp_path / "run"
    _earlier_run(run, ["reward=process", "actor.lr=3e-4"])
    cfg = _composed([f"trainer.run_dir={run}", "trainer.resume=auto", "reward=goal", "actor.lr=1e-4",
                     "trainer.total_steps=90"], command_here)
    assert list(cfg["reward"]["components"]) == ["goal"]  # the run's process component is not mixed in
    assert cfg["actor"]["lr"] == 1e-4 and cfg["trainer"]["total_steps"] == 90


def test_a_change_the_checkpoint_cannot_continue_under_is_refused_in_one_line(tmp_path, command_here):
    run = tmp_path / "run"
    before = _earlier_run(run, ["env=guess_number"])
    for override, old, new in (("env=key_door", "guess_number", "key_door"),
                               ("model.tiny.hidden_size=64", "128", "64")):
        out = command_here(["train", f"trainer.run_dir={run}", "trainer.resume=auto", override])
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        key = "env.name" if override.startswith("env") else "model.tiny.hidden_size"
        assert out.stderr.strip().splitlines() == [
            f"error: {key}={new}: the run in {run} was started with {key}={old}, and it cannot continue under "
            f"another value; drop the override to continue the run, or start a new run (another trainer.run_dir)"]
    assert (run / "config.json").read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


def test_a_real_resume_keeps_the_reward_prints_and_records_the_change_and_keeps_config_json(tmp_path, ray_local,
                                                                                            command_here):
    run = tmp_path / "run"
    first = command_here(["train", *SMALL, f"trainer.run_dir={run}", "reward=process", "trainer.total_steps=2"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    record = (run / "config.json").read_bytes()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Every validation's samples are kept in the run folder, as JSONL and as the page `rollout` writes.
    assert sorted(p.name for p in (run / "validation").iterdir()) == [
        f"{stem}.{ext}" for stem in ("val_step_000000", "val_step_000002", "warmup_val_step_000000")
        for ext in ("html", "jsonl")]
    samples = [json.loads(line) for line in (run / "validation" / "val_step_000002.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(set(s["reward_parts"]) == {"process"} and s["turns"] for s in samples)
    assert samples[0]["turns"][0]["context"] and "response" in samples[0]["turns"][0]
    model = {p.name: p.read_bytes() for p in (run / "model").iterdir()}
    # env.max_turns is one of the settings the tiny model's tokenizer is built from; the checkpoint's weights were
    # trained with the folder's tokenizer, so the resume keeps the folder as it is.
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}", "trainer.resume=auto", "trainer.total_steps=3",
                        "actor.lr=1e-4", "env.max_turns=5"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert ("changed on resume:\n  actor.lr: 0.0005 -> 0.0001\n  env.max_turns: 4 -> 5\n  rollout.max_turns: 4 -> 5\n"
            "  trainer.total_steps: 2 -> 3\n") in out.stdout
    assert "resumed: keeping the tiny model's tokenizer" in out.stdout and "built the tiny model" not in out.stdout
    # A resume says what it skips, and does not announce a warm-up it will not run.
    assert ("warm-up skipped (resuming from step_000002: the untrained validation and the warm-up ran before it)"
            in out.stdout and "warm-up 1 steps at lr" not in out.stdout)
    assert {p.name: p.read_bytes() for p in (run / "model").iterdir()} == model
    assert (run / "config.json").read_bytes() == record
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [(h["step"], h["changes"]) for h in history] == [
        (3, {"actor.lr": {"from": 0.0005, "to": 0.0001}, "env.max_turns": {"from": 4, "to": 5},
             "rollout.max_turns": {"from": 4, "to": 5}, "trainer.total_steps": {"from": 2, "to": 3}})]
    after = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert after[:len(rows)] == rows
    assert after[-1]["step"] == 3 and "train/reward/process/mean" in after[-1]
    assert not any(k.startswith("train/reward/goal") for k in after[-1])
    log = (run / "train.log").read_text().splitlines()
    assert [line.split(":")[0] for line in log] == ["step 1/2", "step 2/2", "step 3/3"]
    # Resumed again with nothing on the command line: the recorded change holds, nothing new is recorded.
    again = command_here(["train", *SMALL, f"trainer.run_dir={run}", "trainer.resume=auto", "--cfg", "job"])
    cfg = yaml.safe_load(again.stdout)
    assert cfg["actor"]["lr"] == 1e-4 and cfg["trainer"]["total_steps"] == 3


@pytest.mark.slow
def test_the_warm_up_alone_is_a_run_of_0_steps_that_eval_scores_and_a_resume_continues_with_rl(tmp_path, ray_local,
                                                                                               command_here):
    run = tmp_path / "run"
    warm = ["warmup.steps=30", "env.val_tasks=6", "env.train_tasks=8"]
    first = command_here(["train", *SMALL, *warm, f"trainer.run_dir={run}", "trainer.total_steps=0"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 0 and row["warmup/steps"] == 30 and "train/reward_mean" not in row
    assert [p.name for p in (run / "checkpoints").iterdir() if p.is_dir()] == ["step_000000"]
    success = row["warmup/val/success_rate"]
    assert "done: 0 steps in" in first.stdout and f"success rate {success:.3f}" in first.stdout.splitlines()[-2]
    scored = command_here(["eval", f"trainer.checkpoint={run}"])
    assert f"success rate {success:.3f} (95% interval" in scored.stdout, scored.stdout + scored.stderr[-2000:]
    more = command_here(["train", *SMALL, *warm, f"trainer.run_dir={run}", "trainer.resume=auto",
                         "trainer.total_steps=1"])
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert "resumed from" in more.stdout and "warm-up step" not in more.stdout  # RL goes on from the warmed model
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == row and rows[-1]["step"] == 1 and "train/reward_mean" in rows[-1]


def test_eval_from_a_run_takes_the_runs_validation_file_and_count(tmp_path):
    from openmanus_rl_core.commands.from_run import _run_validation

    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "val.parquet").write_bytes(b"")
    c = load(["env=textcraft"])
    data, trainer, where = _run_validation(c, run / "checkpoints" / "step_000010",
                                           {"data": {"val_files": None}, "trainer": {"val_max_tasks": 16}})
    assert data.val_files == str(run / "data" / "val.parquet") and trainer.val_max_tasks == 16
    assert where == f"the run's validation set ({run / 'data' / 'val.parquet'}, its first 16)"
    data, trainer, where = _run_validation(c, run / "checkpoints" / "step_000010",
                                           {"data": {"val_files": "/data/val.parquet"}, "trainer": {}})
    assert (data.val_files, trainer.val_max_tasks, where) == (
        "/data/val.parquet", None, "the run's validation set (/data/val.parquet)")
