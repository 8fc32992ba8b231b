"""BabyAI in-process: AgentGym's text and high-level actions, AgentGym's task ids, success below reward 1, the bot
oracle through the rollout loop, arbitrary actions, and a 2-step GRPO run from the command line."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.protocols import OracleEnv, StepResult
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_env, hostile_texts, oracle_rollout
from openmanus_rl_env_babyai import AGENTGYM_LEVELS, BabyAIEnv, hooks

CONFIGS = Path(hooks.__file__).parent / "configs"
CONFIG = yaml.safe_load((CONFIGS / "env" / "babyai.yaml").read_text())
BIN = Path(sys.executable).parent


def test_registered_and_task_ids_are_agentgym_data_indices():
    env = registry("env").build("babyai", **CONFIG["kwargs"])
    assert isinstance(env, OracleEnv) and env.instruction
    assert len(AGENTGYM_LEVELS) == 40 and env.num_tasks == 40 * 1_000_000
    assert env.level_and_seed(0) == ("BabyAI-GoToRedBallGrey-v0", 0)
    assert env.level_and_seed(44) == ("BabyAI-GoToLocalS8N7-v0", 1)
    assert CONFIG["train_tasks"] % 40 == 0  # validation ids start on a fresh seed of every level
    assert env.task_fields(81)["extra"] == {"level": "BabyAI-GoToRedBall-v0", "level_seed": 2}
    with pytest.raises(ValueError, match="not BabyAI level ids"):
        BabyAIEnv(levels=["BabyAI-Nope-v0"])


def test_agentgym_observation_and_actions():
    env = BabyAIEnv()
    obs = env.reset(4, 0)  # GoToLocalS8N7, seed 0
    lines = obs.split("\n")
    assert lines[0].startswith("Your goal: go to ")
    assert lines[1].startswith("In front of you in this room, you can see several objects: There is a ")
    assert re.search(r"There is a \w+ \w+ \d (right in front of you \d+ steps away|\d+ steps in front of you and "
                     r"\d+ steps to your (left|right))\.  ", lines[1])
    assert "The room has walls around you." in lines[1] and lines[1].endswith("You are not carrying anything.")
    listed = json.loads(lines[2][len("Available actions: "):])
    assert listed[:2] == ["turn left", "turn right"] and listed[-1] == "check available actions"
    assert any(a.startswith("go to ") for a in listed) and any(a.startswith("pickup ") for a in listed)
    r = env.step("fly away")
    assert r.observation.startswith("The action is not recognized. Please check valid actions.\nAvailable actions:")
    assert r.info["invalid"] and not r.done and r.reward == 0.0
    r = env.step("drop")
    assert r.observation.startswith("You cannot drop the object, as you are not carrying anything.")
    r = env.step("check available actions")
    assert r.observation.startswith("You can take the following actions: turn left, turn right")
    r = env.step("turn left")
    assert not r.info["invalid"] and "Available actions" in r.observation


def test_a_redrawn_room_layout_goes_to_the_debug_log_not_to_stdout(capsys, caplog):
    """GoToLocal task 8's first random layout is rejected (an unreachable object) and redrawn: minigrid's notice
    of it reaches the debug log, and the run's output stays clean."""
    env = BabyAIEnv(levels=["BabyAI-GoToLocal-v0"])
    with caplog.at_level("DEBUG", logger="openmanus_rl_env_babyai.env"):
        obs = env.reset(8)
    assert obs.startswith("Your goal: ")
    assert capsys.readouterr().out == ""
    assert any("unreachable object" in r.getMessage() for r in caplog.records)


def test_success_when_mission_done_with_reward_below_one():
    env = BabyAIEnv()
    obs = env.reset(0, 0)  # GoToRedBallGrey
    target = next(a for a in env.actions if a.startswith("go to red ball"))
    r = env.step(" Go To " + target[len("go to "):].upper())
    assert r.done and r.info["success"] is True and 0.0 < r.reward < 1.0
    assert r.observation.split("\nAvailable")[0].endswith("\n The task is completed.")
    assert "red ball" in obs
    after = env.step("turn left")
    assert after.done and after.reward == 0.0 and after.info["success"] is True


def test_a_level_completed_late_with_a_small_positive_reward_is_still_a_success():
    env = BabyAIEnv()
    env.reset(0, 0)  # GoToRedBallGrey: 64 steps; a finished mission pays 1 - 0.9 * steps / 64
    level = env.env.unwrapped
    while level.step_count < level.max_steps - 12:  # waste most of the level's steps
        assert env.step("turn left").done is False
    target = next(a for a in env.actions if a.startswith("go to red ball"))
    r = env.step(target)
    steps = r.info["level_steps"]
    assert r.done and r.info["success"] is True and steps > 52
    assert r.reward == pytest.approx(1 - 0.9 * steps / 64) and 0.0 < r.reward < 0.3
    assert r.observation.split("\nAvailable")[0].endswith("\n The task is completed.")


def test_pick_up_reads_as_pickup():
    env = BabyAIEnv(levels=["BabyAI-PickupLoc-v0"])
    env.reset(0, 0)
    name = next(a for a in env.actions if a.startswith("pickup "))
    r = env.step("pick up " + name[len("pickup "):])
    assert not r.info["invalid"]
    assert "You are carrying a" in r.observation or r.done


def test_conformance_kit():
    check_env(lambda: BabyAIEnv(levels=["BabyAI-GoToLocal-v0", "BabyAI-Open-v0"]), task_ids=[0, 1, None],
              actions=["turn left", "move forward", "toggle", "go to red ball 1", "pickup blue key 1"])


def test_oracle_through_the_rollout_loop_on_20_validation_tasks():
    from openmanus_rl_core.models.loading import build_tokenizer

    env = BabyAIEnv()
    tasks = [{"task_id": CONFIG["train_tasks"] + k, "seed": k} for k in range(20)]
    texts = [env.reset(t["task_id"], t["seed"]) for t in tasks[:4]] + [env.instruction]
    tok = build_tokenizer(texts, vocab_size=600)
    template = registry("template").build("react")
    trajs = oracle_rollout(BabyAIEnv, tasks, template, tok, max_turns=CONFIG["max_turns"],
                           max_prompt_tokens=4096, max_response_tokens=200_000, max_obs_tokens=2048)
    wins = [t.turns[-1].info.get("success") is True for t in trajs]
    assert sum(wins) >= 19, [(t.task_id, t.termination, t.num_turns) for t in trajs]


def test_random_and_invalid_action_streams_never_raise():
    rng = random.Random(0)
    env = BabyAIEnv(levels=["BabyAI-GoToLocal-v0", "BabyAI-UnlockLocal-v0", "BabyAI-PutNextLocal-v0"])
    junk = hostile_texts(20) + [None, b"\xfe", 7, "x" * 50_000, "check", "pick up", "go to"]
    for task_id in range(6):
        env.reset(task_id, 0)
        for i in range(80):
            action = rng.choice(list(env.actions)) if i % 2 else rng.choice(junk)
            r = env.step(action)
            assert isinstance(r, StepResult) and isinstance(r.observation, str) and isinstance(r.done, bool)
            assert 0.0 <= r.reward <= 1.0 and isinstance(r.info["invalid"], bool)
            if r.done:
                assert isinstance(r.info["success"], bool)
                env.reset(task_id, 0)
    env.close()


def test_learning_preset_composes():
    from openmanus_rl_core.config.loading import load

    cfg = load(["+experiment=babyai_goto"])  # checked against the schema like any training config
    assert cfg.env.name == "babyai" and list(cfg.env.kwargs["levels"]) == ["BabyAI-GoToLocal-v0"]
    assert (cfg.trainer.total_steps, cfg.rollout.max_turns, cfg.warmup.steps, cfg.warmup.num_demos) == (20, 3, 300, 1000)
    env = BabyAIEnv(**cfg.env.kwargs)
    assert env.reset(cfg.env.train_tasks, 0).startswith("Your goal: go to ")


# make test trains this env from the command line through its presets (babyai_quick and babyai_goto):
# tests/test_benchmark_presets.py
@pytest.mark.long
def test_two_step_grpo_train_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "openmanus-rl"), "train", "env=babyai", "env.kwargs.levels=[BabyAI-GoToObj-v0]",
           "env.train_tasks=40", "env.val_tasks=4", "env.max_turns=2", "trainer.total_steps=2",
           "data.train_batch_size=2", "algorithm.n=2", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
           "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
           "model.tiny.vocab_size=400", "model.corpus_tasks=8", "rollout.max_new_tokens=8",
           "rollout.max_prompt_tokens=1024", "rollout.max_obs_tokens=512", "warmup.steps=1", "warmup.num_demos=4",
           "warmup.validate=false", "trainer.num_workers=1", "trainer.loggers=[]", "trainer.progress=false",
           "trainer.save_at_end=false", f"trainer.run_dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(0.0 <= r["train/success_rate"] <= 1.0 for r in records[1:])
    assert records[-1]["val/success_rate"] is not None


def test_data_make_writes_unseen_seeds_for_validation(tmp_path):
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.commands.data import make
    from openmanus_rl_core.data.tasks import load_tasks

    assert make(load(["env=babyai", f"data.dir={tmp_path}"], training=False)) == 0
    train, val = load_tasks(tmp_path / "train.parquet"), load_tasks(tmp_path / "val.parquet")
    assert (len(train), len(val)) == (800, 80)
    assert max(t["extra"]["level_seed"] for t in train) < min(t["extra"]["level_seed"] for t in val)
    assert {t["extra"]["level"] for t in val} == set(AGENTGYM_LEVELS)
