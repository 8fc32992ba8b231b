"""``opponent=pool`` across a kill -9, as every run: with nothing set, the pool lives in the run's folder and in each
checkpoint, as is the table of ``algorithm.adv_estimator=value_table`` (its action values too); a run killed after a
checkpoint and resumed logs the same history up to the kill, finds exactly the checkpoint's snapshots (byte for byte, whatever happened to
the folder since), takes the later ones again, averages the policies the checkpoint kept with the later ones
(``val/exploitability_average`` as before the kill), and its rollout dumps hold each seat's samples with the seat
named."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pyspiel
import pytest

from openmanus_rl_core.checkpoint.store import latest_checkpoint, load_checkpoint, step_of
from openmanus_rl_env_openspiel import hooks, pool
from openmanus_rl_env_openspiel.exploitability import information_states

REPO, BIN = Path(__file__).resolve().parents[4], Path(sys.executable).parent
kill_once_written = runpy.run_path(str(REPO / "tests" / "kills.py"))["kill_once_written"]  # the core's kill tests'

# A tiny model, two games of a task a step (each seat once), a snapshot at every step's validation and a checkpoint
# every 4 steps. One env thread and a long generate wait make each generate call take every live episode, in the
# order they started: the episodes mode then samples the same tokens in two runs, as lockstep does. top_k=2: the
# warmed-up tiny model's replies are legal moves, so the pool's seats play.
SETTINGS = ["+experiment=kuhn_selfplay", "env.kwargs.opponent=pool", "env.kwargs.refresh_steps=1",
            "trainer.val_freq=1", "trainer.save_freq=4", "trainer.total_steps=12", "trainer.progress=false",
            "trainer.loggers=[]", "trainer.num_cpus=1", "trainer.num_workers=1", "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
            "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=2",
            "algorithm.n=2", "env.train_tasks=32", "env.val_tasks=4", "model.corpus_tasks=8", "warmup.steps=60",
            "warmup.num_demos=64", "warmup.validate=false", "trainer.save_rollouts=true", "rollout.env_workers=1",
            "rollout.gen_wait_ms=5000", "rollout.top_k=2",
            # the one estimator with state (its table of state and action values): resumed from the checkpoint as
            # the pool is
            "algorithm.adv_estimator=value_table", "algorithm.lam=0.5", "rollout.constrain_actions=true",
            "algorithm.all_action_coeff=0.3"]
WALL_CLOCK = ("timing/", "perf/", "time/", "rollout/time_s", "rollout/episodes_per_s", "rollout/turns_per_s",
              "rollout/tokens_per_s")


def records(run) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(WALL_CLOCK)} for r in rows}


def pool_files(run) -> dict[int, bytes]:
    return {s: (run / "pool" / f"step_{s}.json").read_bytes() for s in pool.snapshots(run / "pool")}


def table(body: bytes) -> dict:
    return {(p, info): probs for p, info, probs in json.loads(body)["table"]}


@pytest.mark.ray  # the killed command starts a Ray of its own
@pytest.mark.slow
def test_a_pool_run_killed_with_sigkill_resumes_with_its_history_its_pool_and_named_seats(tmp_path, cli_env,
                                                                                         ray_local, command_here):
    run = tmp_path / "run"
    cmd = [str(BIN / "openmanus-rl"), "train", *SETTINGS, f"trainer.run_dir={run}"]
    kill_once_written(cmd, run / "pool" / "step_6.json", cli_env)  # step 5 logged, after step 4's checkpoint
    killed, before = records(run), pool_files(run)
    last, checkpoint = max(killed), step_of(latest_checkpoint(run))
    assert checkpoint == 4 and last >= 5 and list(before) == list(range(max(before) + 1)) and max(before) >= 6
    kept = load_checkpoint(run / "checkpoints" / "step_000004", keys=["plugins"])["plugins"]
    assert kept[hooks.CHECKPOINT_KEY] == {"snapshots": {s: before[s] for s in range(5)}}
    assert list(kept[hooks.AVERAGE_KEY]["tables"]) == [1, 2, 3, 4]  # the average policy's, after the warm-up
    values = load_checkpoint(run / "checkpoints" / "step_000004", keys=["estimator"])["estimator"]
    # every first move of 4 steps (4 episodes a step, one a seat of a task's two games): the resumed steps'
    # advantages read these values, so a table lost on resume would change the history from step 5 on
    assert sorted((role, turn) for role, turn, _, _ in values["turns"] if turn == 0) == [
        ("kuhn_poker:seat0", 0), ("kuhn_poker:seat1", 0)]
    assert sum(visits for _, turn, _, visits in values["turns"] if turn == 0) == 4 * 4
    # and the action values of the replies' choices, each at a state the table holds
    states = {(role, obs) for role, obs, _, _ in values["states"]}
    assert values["actions"] and all((role, obs) in states for role, obs, _, _, _ in values["actions"])

    # after the kill the folder loses a snapshot the resumed steps draw from, and another one is altered
    (run / "pool" / "step_3.json").unlink()
    bet = {key: {a: float(a == 1) for a in state.legal_actions()}  # always Bet
           for key, state in information_states(pyspiel.load_game("kuhn_poker")).items()}
    pool.write_snapshot(run / "pool", 4, "kuhn_poker", bet)
    out = command_here(["train", *SETTINGS, f"trainer.run_dir={run}", "trainer.resume=auto"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    later = [s for s in before if s > 4]
    assert (f"the pool in {run / 'pool'} put back to the checkpoint of step 4: snapshots [3, 4] written again, "
            f"{later} (after the checkpoint) removed") in out.stdout

    # the same history up to the kill, every step once
    resumed = records(run)
    assert sorted(resumed) == list(range(13))
    assert "val/exploitability_average" in killed[5]
    for step in range(last + 1):
        assert resumed[step].keys() == killed[step].keys(), step
        for key, value in killed[step].items():
            assert resumed[step][key] == pytest.approx(value, rel=1e-6, abs=1e-6), (step, key)
    # the pool: the checkpoint's snapshots byte for byte, the later ones taken again with the same policy
    after = pool_files(run)
    assert sorted(after) == list(range(13))
    assert {s: after[s] for s in range(5)} == {s: before[s] for s in range(5)}
    for s in later:
        again, first = table(after[s]), table(before[s])
        assert again.keys() == first.keys()
        for key, probs in first.items():
            assert again[key] == pytest.approx(probs, abs=1e-6), (s, key)
    # the dumps: each step's samples, each seat's named
    for step in range(1, 13):
        dump = pq.read_table(run / "rollouts" / f"step_{step:06d}.parquet").to_pydict()
        assert sorted(dump["role"]) == ["kuhn_poker:seat0"] * 2 + ["kuhn_poker:seat1"] * 2, step
        assert all(g.endswith("|" + r) for g, r in zip(dump["group_id"], dump["role"]))

