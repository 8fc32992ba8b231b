"""TextCraft in-process: AgentGym's text, portable task ids, tasks by content, the planner oracle through the rollout
loop, arbitrary actions, and a 2-step GRPO run from the command line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.protocols import OracleEnv, StepResult
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_env, check_oracle, hostile_texts, oracle_rollout
from openmanus_rl_env_textcraft import TextCraftEnv, hooks

CONFIG = yaml.safe_load((Path(hooks.__file__).parent / "configs" / "env" / "textcraft.yaml").read_text())
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def env():
    return TextCraftEnv()


def test_registered_with_config_matching_the_split(env):
    built = registry("env").build("textcraft", **CONFIG["kwargs"])
    assert isinstance(built, OracleEnv) and built.instruction
    assert (env.num_tasks, env.num_train) == (544, 436)
    assert CONFIG["train_tasks"] == env.num_train and CONFIG["val_tasks"] == env.num_tasks - env.num_train
    # validation rows land on validation goals: one in five of the sorted goal list
    assert env.task_fields(env.num_train)["extra"]["split"] == "val"
    assert env.task_fields(env.num_train - 1)["extra"]["split"] == "train"
    assert env.goal_index(env.num_train) == 4 and env.goal_index(0) == 0 and env.goal_index(4) == 5


def test_agentgym_text_and_rules(env):
    obs = env.reset_to("oak planks", ["craft 4 oak planks using 1 oak logs", "craft 4 stick using 2 planks"])
    assert obs == ("Crafting commands:\ncraft 4 oak planks using 1 oak logs\ncraft 4 stick using 2 planks\n\n"
                   "Goal: craft oak planks.")
    assert env.step("inventory").observation == "Inventory: You are not carrying anything."
    assert env.step("craft 4 oak planks using 1 oak logs").observation == \
        "Could not find enough items to craft minecraft:oak_planks"
    assert env.step("get 2 oak planks").observation == "Could not find oak planks"  # craftable: not fetched
    r = env.step("dance")
    assert r.observation == "Could not execute dance" and r.info["invalid"] and not r.done
    r = env.step("get 2 oak logs")
    assert (r.observation, r.reward, r.done, r.info["invalid"]) == ("Got 2 oak logs", 0.0, False, False)
    assert env.step("  Inventory ").observation == "Inventory: [oak logs] (2) "
    r = env.step("craft 4 oak planks using 1 oak logs")
    assert (r.observation, r.reward, r.done, r.info["success"]) == ("Crafted 4 minecraft:oak_planks", 1.0, True, True)
    # a generic ingredient ("planks") is crafted with a concrete item of that tag
    env.reset_to("stick", ["craft 4 stick using 2 planks"])
    env.step("get 1 oak logs")
    assert env.step("craft 4 stick using 2 planks").observation == "Could not find enough items to craft minecraft:stick"
    env.reset_to("stick", ["craft 4 stick using 2 planks", "craft 4 oak planks using 1 oak logs"])
    assert [env.step(env.oracle_action()).observation for _ in range(3)] == [
        "Got 1 oak logs", "Crafted 4 minecraft:oak_planks", "Crafted 4 minecraft:stick"]
    assert env.success


def test_task_ids_are_fixed_and_independent_of_hash_seed_and_listdir(env):
    assert env.goals.items[:3] == ["minecraft:acacia_planks", "minecraft:acacia_wood", "minecraft:beacon"]
    assert env.task_id_of("flint and steel") == 180 and env.task_id_of("minecraft:honey_block") == 446
    code = ("from openmanus_rl_env_textcraft import TextCraftEnv; e = TextCraftEnv(); "
            "print(repr(e.reset(180, 7)), repr(e.reset(500, 3)))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)}
    assert len(outs) == 1
    assert outs.pop() == f"{env.reset(180, 7)!r} {env.reset(500, 3)!r}\n"
    assert env.reset(180, 7).endswith("Goal: craft flint and steel.")
    assert env.reset(180, 7) != env.reset(180, 8)  # the seed picks distractors and their order


def test_task_by_content_replays_its_observation(env):
    for task_id, seed in [(0, 0), (180, 7), (543, 2)]:
        obs = env.reset(task_id, seed)
        other = TextCraftEnv()
        assert other.reset_from_observation(obs) == obs
        for _ in range(40):
            r = other.step(other.oracle_action())
            if r.done:
                break
        assert r.info["success"]
    with pytest.raises(ValueError, match="not a craftable"):
        env.reset_to("dirt", [])
    with pytest.raises(ValueError, match="Goal: craft"):
        env.reset_from_observation("no task here")


def test_conformance_kit(env):
    env.reset(0, 0)
    check_env(TextCraftEnv, task_ids=[0, 1, None, 440], actions=[env.oracle_action(), "inventory", "get 1 oak logs"])
    check_oracle(TextCraftEnv, task_ids=list(range(0, 544, 17)), max_steps=CONFIG["max_turns"])


def test_oracle_through_the_rollout_loop_on_20_validation_tasks(env):
    from openmanus_rl_core.models.loading import build_tokenizer

    tasks = [{"task_id": env.num_train + k, "seed": k} for k in range(20)]
    texts = [env.reset(t["task_id"], t["seed"]) for t in tasks] + [env.instruction]
    tok = build_tokenizer(texts, vocab_size=600)
    template = registry("template").build("react")
    trajs = oracle_rollout(TextCraftEnv, tasks, template, tok, max_turns=CONFIG["max_turns"],
                           max_prompt_tokens=2048, max_response_tokens=8192, max_obs_tokens=512)
    assert sum(t.success is True or t.turns[-1].info.get("success") is True for t in trajs) >= 19
    assert all(t.termination == "done" for t in trajs)


def test_random_and_invalid_action_streams_never_raise(env):
    rng = random.Random(0)
    words = ["get", "craft", "using", "inventory", "1", "4", "oak", "planks", "stick", ",", "minecraft:oak_log", "99"]
    streams = hostile_texts(30) + [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    streams += [None, b"\xff", 3.5, "get 999999999999999999999 oak log", "craft 1 stick using", "x" * 100_000]
    for task_id in (0, 200, 500):
        env.reset(task_id, 1)
        for action in streams:
            r = env.step(action)
            assert isinstance(r, StepResult) and isinstance(r.observation, str) and len(r.observation) < 400
            assert r.reward in (0.0, 1.0) and isinstance(r.info["invalid"], bool)
            if r.done:
                env.reset(task_id, 1)


def test_depth_one_goals():
    shallow = TextCraftEnv(max_depth=1, max_distractors=2)
    assert shallow.num_tasks == 125 and shallow.num_train == 100
    assert all(shallow.goals.depth[g] == 1 for g in shallow.goals.items)
    with pytest.raises(ValueError, match="max_depth"):
        TextCraftEnv(min_depth=2, max_depth=1)


# make test trains this env from the command line through its presets (textcraft_quick and textcraft_depth1):
# tests/test_benchmark_presets.py
@pytest.mark.long
def test_two_step_grpo_train_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "openmanus-rl"), "train", "env=textcraft", "env.kwargs.max_depth=1", "env.train_tasks=100",
           "env.val_tasks=4", "env.max_turns=2", "trainer.total_steps=2", "data.train_batch_size=2", "algorithm.n=2",
           "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
           "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "model.corpus_tasks=8",
           "rollout.max_new_tokens=8", "warmup.steps=1", "warmup.num_demos=4", "warmup.validate=false",
           "trainer.num_workers=1", "trainer.loggers=[]", "trainer.progress=false", "trainer.save_at_end=false",
           f"trainer.run_dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(0.0 <= r["train/success_rate"] <= 1.0 for r in records[1:])
    assert records[-1]["val/success_rate"] is not None


def test_data_make_writes_our_splits(tmp_path):
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.commands.data import make
    from openmanus_rl_core.data.tasks import load_tasks

    assert make(load(["env=textcraft", f"data.dir={tmp_path}"], training=False)) == 0
    train, val = load_tasks(tmp_path / "train.parquet"), load_tasks(tmp_path / "val.parquet")
    assert (len(train), len(val)) == (436, 108)
    assert {t["extra"]["split"] for t in train} == {"train"} and {t["extra"]["split"] for t in val} == {"val"}
    assert val[0]["task_id"] == 436 and val[0]["extra"]["goal"] == "birch wood"
