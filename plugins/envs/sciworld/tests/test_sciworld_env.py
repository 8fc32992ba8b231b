"""ScienceWorld in-process: AgentGym's text, ScienceWorld's splits and score, shared JVMs that never outlive their
envs (not even a killed process), the gold-sequence oracle through the rollout loop, long episodes truncated,
arbitrary actions, and a 2-step GRPO run from the command line."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from openmanus_rl_core.protocols import OracleEnv, StepResult
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_env, hostile_texts, oracle_rollout
from openmanus_rl_env_sciworld import SciWorldEnv, hooks
from openmanus_rl_env_sciworld.jvm import POOL
from openmanus_rl_env_sciworld.tasks import table

CONFIG = yaml.safe_load((Path(hooks.__file__).parent / "configs" / "env" / "sciworld.yaml").read_text())
BIN = Path(sys.executable).parent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids, timeout=30.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def test_registered_with_scienceworld_splits():
    env = registry("env").build("sciworld", **CONFIG["kwargs"])
    assert isinstance(env, OracleEnv) and env.instruction
    assert len(table()) == 30
    assert (env.num_train, env.num_dev, env.num_test) == (3592, 1796, 1819) and env.num_tasks == 7207
    assert CONFIG["train_tasks"] == env.num_train  # validation rows are dev variations
    assert env.task_fields(0)["extra"] == {"task": "boil", "variation": 0, "split": "train"}
    assert env.task_fields(1)["extra"]["task"] == "melt"  # interleaved over tasks
    dev = env.task_fields(env.num_train)["extra"]
    assert dev == {"task": "boil", "variation": table()["boil"]["dev"][0], "split": "dev"}
    one = SciWorldEnv(tasks=["4-1"])
    assert one.num_tasks == sum(len(table()["find-living-thing"][s]) for s in ("train", "dev", "test"))
    with pytest.raises(ValueError, match="not a ScienceWorld task"):
        SciWorldEnv(tasks=["99-9"])
    env.close()


def test_text_score_and_success_and_jvm_closed_with_env():
    env = SciWorldEnv(tasks=["4-1"])  # find a living thing: short gold sequence
    obs = env.reset(0, 0)
    assert obs.startswith("Your task is to find a(n) living thing.")
    assert "\nThis room is called the " in obs
    pids = POOL.pids()
    assert len(pids) == 1 and _alive(pids[0])
    r = env.step("dance wildly")
    assert r.info["invalid"] and r.reward == 0.0 and not r.done and r.info["score"] == 0
    total, r = 0.0, None
    for _ in range(40):
        r = env.step(env.oracle_action())
        total += r.reward
        if r.done:
            break
    assert r.done and r.info["success"] is True and r.info["score"] == 100 and total == pytest.approx(1.0)
    env.close()
    env.close()
    assert _wait_gone(pids) == [] and POOL.pids() == []


def test_envs_share_bounded_jvms():
    envs = [SciWorldEnv(tasks=["4-1"], envs_per_jvm=3, jvm_heap="512m") for _ in range(4)]
    try:
        firsts = [e.reset(k, 0) for k, e in enumerate(envs)]
        assert all(f.startswith("Your task is to find") for f in firsts)
        pids = POOL.pids()
        assert len(pids) == 2  # 3 envs on the first JVM, the fourth on a second
        cmdline = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
        assert b"-Xmx512m" in cmdline
        assert envs[0].step(envs[0].oracle_action()).info["score"] >= 0
        envs[0].close()
        assert POOL.pids() == pids
    finally:
        for e in envs:
            e.close()
    assert _wait_gone(pids) == []


def test_no_java_left_after_a_killed_process(tmp_path):
    code = ("import os, signal, sys; from openmanus_rl_env_sciworld import SciWorldEnv; "
            "from openmanus_rl_env_sciworld.jvm import POOL; e = SciWorldEnv(tasks=['4-1']); e.reset(0, 0); "
            "print(*POOL.pids(), flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 1
    assert _wait_gone(pids) == [], "the JVM outlived its killed process"


def test_conformance_and_arbitrary_actions():
    check_env(lambda: SciWorldEnv(tasks=["4-1"]), task_ids=[0, None], actions=["look around", "go to hallway"])
    rng = random.Random(0)
    env = SciWorldEnv(tasks=["1-1", "4-1"])
    words = ["open", "door", "to", "kitchen", "go", "pick", "up", "focus", "on", "0", "1", "look", "at", "wait"]
    junk = hostile_texts(10) + [None, b"\xff", 4, "x" * 10_000, "1", "wait1"]
    try:
        env.reset(1, 0)
        for i in range(60):
            action = " ".join(rng.choice(words) for _ in range(rng.randint(1, 5))) if i % 2 else rng.choice(junk)
            r = env.step(action)
            assert isinstance(r, StepResult) and isinstance(r.observation, str) and isinstance(r.done, bool)
            assert isinstance(r.info["invalid"], bool) and -1.0 <= r.reward <= 1.0
            if r.done:
                env.reset(1, 0)
    finally:
        env.close()


def _tokenizer(env, tasks):
    from openmanus_rl_core.models.loading import build_tokenizer

    texts = [env.reset(t["task_id"], 0) for t in tasks[:3]] + [env.instruction]
    env.close()
    return build_tokenizer(texts, vocab_size=600)


def test_oracle_through_the_rollout_loop_on_4_dev_tasks():
    """The first 4 dev tasks (about 100 oracle turns; the first 8, 214 turns, all won too), each won."""
    env = SciWorldEnv()
    tasks = [{"task_id": env.num_train + k, "seed": 0} for k in range(4)]
    template = registry("template").build("react")
    trajs = oracle_rollout(SciWorldEnv, tasks, template, _tokenizer(env, tasks), max_turns=CONFIG["max_turns"],
                           max_prompt_tokens=4096, max_response_tokens=500_000, max_obs_tokens=4096,
                           env_timeout_s=300)  # a JVM's first start takes a minute on a loaded machine
    wins = [bool(t.turns) and t.turns[-1].info.get("success") is True for t in trajs]
    assert sum(wins) == 4, [(t.task_id, t.termination, t.num_turns, t.turns[-1].info) for t in trajs]
    assert POOL.pids() == []


def test_long_episode_ends_truncated_and_reported():
    env = SciWorldEnv(tasks=["1-1"])  # boil: about 40 gold actions
    tasks = [{"task_id": 0, "seed": 0}]
    template = registry("template").build("react")
    (traj,) = oracle_rollout(lambda: SciWorldEnv(tasks=["1-1"]), tasks, template, _tokenizer(env, tasks),
                             max_turns=100, max_prompt_tokens=4096, max_response_tokens=600, max_obs_tokens=256)
    assert traj.termination == "truncated" and traj.error is None
    assert 1 <= traj.num_turns < 40 and traj.response_length <= 600
    assert POOL.pids() == []


@pytest.mark.long  # make test trains TextCraft and BabyAI from the command line (tests/test_benchmark_presets.py);
# the env's own path is tested above
def test_two_step_grpo_train_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [str(BIN / "openmanus-rl"), "train", "env=sciworld", "env.kwargs.tasks=[4-1]", "env.kwargs.envs_per_jvm=8",
           "env.train_tasks=150", "env.val_tasks=2", "env.max_turns=2", "trainer.total_steps=2",
           "data.train_batch_size=2", "algorithm.n=2", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
           "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
           "model.tiny.vocab_size=400", "model.corpus_tasks=2", "rollout.max_new_tokens=8",
           "rollout.max_prompt_tokens=1024", "rollout.max_obs_tokens=512", "warmup.steps=1", "warmup.num_demos=2",
           "warmup.validate=false", "trainer.num_workers=1", "trainer.loggers=[]", "trainer.progress=false",
           "trainer.save_at_end=false", "rollout.env_timeout_s=300", f"trainer.run_dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(0.0 <= r["train/success_rate"] <= 1.0 for r in records[1:])


def test_data_make_writes_scienceworld_splits(tmp_path):
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.commands.data import make
    from openmanus_rl_core.data.tasks import load_tasks

    assert make(load(["env=sciworld", f"data.dir={tmp_path}"], training=False)) == 0
    train, val = load_tasks(tmp_path / "train.parquet"), load_tasks(tmp_path / "val.parquet")
    assert (len(train), len(val)) == (3592, 64)
    assert {t["extra"]["split"] for t in train} == {"train"} and {t["extra"]["split"] for t in val} == {"dev"}
    assert len({t["extra"]["task"] for t in val}) == 30  # the first 64 dev variations cover every task
    assert POOL.pids() == []  # writing task files starts no JVM
