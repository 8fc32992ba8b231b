"""A function-style reward plugin from a throwaway distribution: a plain ``compute_score(solution_str, ground_truth,
**kwargs)`` registered under ``openmanus_rl.rewards`` (no class), pip-installed, selected by config, and used by a
real GRPO run on the dataset env's arithmetic set; then uninstalled.

Also (fast): a scorer that raises or returns NaN on one sample gives that sample 0 and counts the error in
``reward/<label>/errors`` while the rest of the batch is scored.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.rewards.components import FunctionReward
from openmanus_rl_core.rewards.composer import ComponentSpec, RewardComposer

DIST = "omrl-fnreward-demo"
PKG = "omrl_fnreward_demo"
LABEL = "tp"

PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST}"
version = "0.0.1"

[project.entry-points."openmanus_rl.rewards"]
tp_answer = "{PKG}.score:compute_score"

[tool.setuptools]
packages = ["{PKG}"]
"""

SCORE = '''
import re


def compute_score(solution_str, ground_truth, data_source=None, **kwargs):
    """1 if the last integer in the reply equals the ground truth; plus whether any integer was given."""
    if ground_truth is None:
        raise ValueError("tp_answer: no ground truth reached the scorer")
    numbers = re.findall(r"-?\\d+", solution_str)
    found = bool(numbers)
    return {"score": float(found and int(numbers[-1]) == int(ground_truth)), "found": float(found),
            "from_arithmetic": float(data_source == "arithmetic")}
'''


@pytest.fixture
def fn_reward_dist(throwaway_dists):
    return throwaway_dists.install(DIST, {"pyproject.toml": PYPROJECT, f"{PKG}/__init__.py": "",
                                          f"{PKG}/score.py": SCORE})


@pytest.mark.slow
def test_grpo_run_on_the_dataset_env_scored_by_a_function_plugin(fn_reward_dist, cli_env, tmp_path, ray_local,
                                                                 command_here, monkeypatch):
    # The function is listed like any component, from metadata.
    listed = subprocess.run(["openmanus-rl", "plugins", "reward", "--json"], capture_output=True, text=True,
                            env=cli_env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["tp_answer"]["distribution"] == DIST and rows["tp_answer"]["status"] == "ok"

    run_dir = tmp_path / "run"
    cmd = [
        "train", "env=dataset",
        # replace the default reward with the plugin's function alone
        "~reward.components.goal", "~reward.components.format", "~reward.components.invalid_action",
        f"+reward.components.{LABEL}={{name:tp_answer,weight:1.0}}",
        "env.kwargs.arithmetic_size=40", "env.train_tasks=32", "env.val_tasks=8",
        "trainer.total_steps=2", "data.train_batch_size=2", "algorithm.n=2",
        "warmup.steps=1", "warmup.num_demos=8", "trainer.val_max_tasks=4", "trainer.val_before_train=false",
        "trainer.num_workers=1", "trainer.loggers=[]", "trainer.progress=false",
        f"trainer.run_dir={run_dir}",
    ]
    monkeypatch.chdir(tmp_path)
    proc = command_here(cmd)  # the command's function, in this process, on the tests' shared Ray
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [m for m in lines if f"train/reward/{LABEL}/mean" in m]
    assert [m["step"] for m in train] == [1, 2]
    for m in train:
        assert 0.0 <= m[f"train/reward/{LABEL}/mean"] <= 1.0
        # the ground truth (and the row's data_source) reached the function on every sample: no errors
        assert m[f"train/reward/{LABEL}/errors"] == 0.0
        assert m[f"train/reward/{LABEL}/from_arithmetic/mean"] == 1.0
    assert any(f"val/reward/{LABEL}/mean" in m for m in lines)
    # the generated task files carry each row's ground truth
    import pyarrow.parquet as pq

    assert "ground_truth" in pq.read_schema(run_dir / "data" / "train.parquet").names


# ------------------------------------------------------------------------------------------- fast checks
def _traj(task_id: int, reply: str, ground_truth) -> Trajectory:
    return Trajectory(task_id=task_id, seed=0, group_id=0, initial_observation="What is 2 + 2?",
                      turns=[Turn(reply, ParsedAction("action", reply, True), "", 0.0, True, {}, (0, 2))],
                      task={"ground_truth": ground_truth, "data_source": "arithmetic"})


def test_a_scorer_raising_on_one_sample_counts_an_error_and_the_batch_goes_on():
    composer = RewardComposer.from_config({
        "math": {"name": "math_answer", "weight": 1.0},
        "f1": {"name": "token_f1", "weight": 1.0},
    })
    batch = [_traj(0, "4", "4"), _traj(1, "4", {"oops": 4}), _traj(2, "4", "four"), _traj(3, "5", "4")]
    breakdowns, metrics = composer.compose_batch(batch)
    assert [b.raw["math"] for b in breakdowns] == [1.0, 0.0, 0.0, 0.0]
    assert metrics["reward/math/errors"] == 2.0          # the dict row and the non-numeric row
    assert metrics["reward/f1/errors"] == 1.0            # only the dict row
    assert metrics["reward/math/mean"] == pytest.approx(0.25)
    assert "math_answer" in breakdowns[1].errors["math"] and "{'oops': 4}" in breakdowns[1].errors["math"]
    assert "math_answer" in breakdowns[2].errors["math"] and "'four'" in breakdowns[2].errors["math"]


def test_a_function_returning_nan_on_one_sample_is_counted():
    def compute_score(solution_str, ground_truth, **kwargs):
        return float("nan") if ground_truth == "bad" else 1.0

    composer = RewardComposer([ComponentSpec("fn", "fn", 2.0, FunctionReward(compute_score))])
    breakdowns, metrics = composer.compose_batch([_traj(0, "x", "a"), _traj(1, "x", "bad"), _traj(2, "x", "b")])
    assert [b.total for b in breakdowns] == [2.0, 0.0, 2.0]
    assert metrics["reward/fn/errors"] == 1.0 and metrics["reward/fn/mean"] == pytest.approx(4 / 3)
