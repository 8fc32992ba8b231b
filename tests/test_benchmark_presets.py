"""Every ``+experiment=`` preset that docs/benchmarks.md lists composes: the config loads and passes every check
(no unknown key, plugin kwargs included), and each value the preset sets is the value the run gets. And each one
trains: its warm-up and 2 RL steps, shrunk to seconds, from the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.config.loading import load
from openmanus_rl_core.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
PRESETS = sorted(set(re.findall(r"\+experiment=(\w+)", DOC.read_text())))


def _file(name: str) -> Path:
    (path,) = ROOT.glob(f"plugins/envs/*/openmanus_rl_env_*/configs/experiment/{name}.yaml")
    return path


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_the_page_lists_a_quick_preset_for_each_real_benchmark_it_trains():
    assert {"babyai_goto", "babyai_quick", "textcraft_quick"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_listed_preset_composes_and_every_value_it_sets_arrives(name):
    cfg = load([f"+experiment={name}"])
    preset = yaml.safe_load(_file(name).read_text())
    env = next(d["override /env"] for d in preset.pop("defaults") if isinstance(d, dict) and "override /env" in d)
    assert cfg.env.name == env
    leaves = dict(_leaves(preset))
    assert leaves, name
    for key, value in leaves.items():
        got = cfg
        for part in key.split("."):
            got = got[part] if isinstance(got, dict) else getattr(got, part)
        assert got == value, (name, key)


# Each preset shrunk to seconds: a smaller model and fewer tasks, demonstrations and steps. The preset's own env
# settings (level, turns, observation text, prompt budgets) and its algorithm and rewards stay as it sets them.
SHRUNK = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64",
    "env.train_tasks=16", "env.val_tasks=4", "data.train_batch_size=2", "algorithm.n=2",
    "warmup.steps=2", "warmup.num_demos=8", "warmup.batch_size=4", "trainer.total_steps=2", "trainer.val_freq=0",
    "trainer.save_freq=0", "trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=2",
    "trainer.num_workers=1",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_every_listed_preset_runs_its_warm_up_and_two_rl_steps(name, ray_local, command_here, tmp_path):
    """The whole recipe, shrunk: validation untrained, the warm-up on the env's demonstrations, 2 GRPO steps, the
    final validation and a checkpoint, on the preset's env exactly as it sets it. From the command line's words:
    the console script's function (``cli.main``), in this process, on the tests' shared Ray."""
    run_dir = tmp_path / name
    proc = command_here(["train", f"+experiment={name}", *SHRUNK, f"trainer.run_dir={run_dir}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recs = read_metrics(run_dir)
    assert [r["step"] for r in recs if "train/reward_mean" in r] == [1, 2]
    assert recs[0]["step"] == 0 and recs[0]["warmup/steps"] == 2 and "warmup/val/success_rate" in recs[0]
    final = [r for r in recs if "val/success_rate" in r][-1]
    assert final["step"] == 2 and 0.0 <= final["val/success_rate"] <= 1.0
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
    episodes = [json.loads(line) for line in (run_dir / "validation" / "val_step_000002.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    assert not any(e["info"].get("prompt_truncated") for e in episodes), "the preset's prompt budget cuts the task"
    episode = episodes[0]
    preset = yaml.safe_load(_file(name).read_text())
    assert episode["num_turns"] <= preset["env"]["max_turns"]
    if name.startswith("babyai"):
        assert episode["initial_observation"].startswith("Your goal: go to")
        assert ("Available actions" in episode["initial_observation"]) == preset["env"]["kwargs"]["show_actions"]
