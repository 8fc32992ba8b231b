"""``opponent=pool``: a validation at a refresh step keeps the policy it scored as a snapshot (and ``eval`` keeps
none); a pool episode's other seats play a snapshot's stored probabilities; which snapshot plays is one of the last
``pool_size`` before the step, a function of the task, the step and the seat (so a resumed run draws the same);
before the first snapshot the samples are self-play seats and the process says so once; bad settings are one line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pyspiel
import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.models.scoring import PolicyScorer
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks
from openmanus_rl_core.testing import ScriptedEngine
from openmanus_rl_env_openspiel import OpenSpielEnv, hooks, pool, tables
from openmanus_rl_env_openspiel.exploitability import information_states

BET, PASS = 1, 0  # kuhn_poker's actions


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["Game: kuhn_poker Pass Bet <action></action> player Legal actions"] * 4, vocab_size=400)


def always(action: int) -> dict:
    game = pyspiel.load_game("kuhn_poker")
    return {key: {a: float(a == action) for a in state.legal_actions()}
            for key, state in information_states(game).items()}


def run(tokenizer, tasks, run_dir, replies="<action>Pass</action>", **kwargs):
    template = build("template", {"name": "react", "kwargs": {}})
    env_kwargs = {"game": "kuhn_poker", "opponent": "pool", "pool_dir": str(run_dir), **kwargs}
    loop = AgentLoop(ScriptedEngine(tokenizer, lambda prompt: replies), tokenizer, template,
                     lambda: OpenSpielEnv(**env_kwargs),
                     RolloutConfig(max_turns=6, mode="episodes", gen_wait_ms=5, max_new_tokens=32))
    return loop.run(tasks)


def test_a_pool_seat_plays_its_snapshots_probabilities(tokenizer, tmp_path):
    pool.write_snapshot(tmp_path, 25, "kuhn_poker", always(BET))
    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"30:{t}"} for t in range(4)], 2)
    episodes = run(tokenizer, tasks, tmp_path)  # the policy always passes; the snapshot always bets
    assert not tables.TABLES  # no shared games: each sample is its own game against the snapshot
    for k, e in enumerate(episodes):
        turns = e.trajectory.turns
        assert e.trajectory.termination == "done"
        assert {t.info["pool_step"] for t in turns} == {25} and turns[0].info["seat"] == k % 2
        if k % 2 == 0:  # seat 0 passes, the snapshot bets, seat 0 passes (folds): -1 whatever the cards
            assert "Moves so far: player 0: Pass; player 1: Bet" in turns[0].observation
            assert e.trajectory.env_reward == -1.0
        else:  # the snapshot bets first, seat 1 passes (folds): -1
            assert re.search(r"Moves so far: player 0: Bet", e.trajectory.initial_observation)
            assert e.trajectory.env_reward == -1.0


def test_which_snapshot_plays_is_one_of_the_last_before_the_step_and_the_same_on_a_resume(tmp_path):
    folder = tmp_path
    assert pool.choose(folder, 30, 7, 1, pool_size=2, refresh_steps=25) is None  # no snapshot yet
    for step in (0, 25, 50, 75):
        pool.write_snapshot(folder, step, "kuhn_poker", always(BET if step % 50 else PASS))
    assert pool.snapshots(folder) == [0, 25, 50, 75]
    drawn = {pool.choose(folder, 60, task, seat, pool_size=2, refresh_steps=25) for task in range(50) for seat in (0, 1)}
    assert drawn == {25, 50}  # the last two before step 60: 75 is a later step's, left by an earlier attempt
    # a function of the task, the step rounded down to refresh_steps, and the seat
    assert [pool.choose(folder, 51, t, 0, 2, 25) for t in range(20)] == [pool.choose(folder, 74, t, 0, 2, 25)
                                                                         for t in range(20)]
    assert {pool.choose(folder, 1, t, 0, 4, 25) for t in range(10)} == {0}
    table = pool.load(folder, 50)
    assert table == always(PASS)
    assert pool.training_step("30:4") == 30 and pool.training_step("val:0") is None


def test_before_the_first_snapshot_the_samples_are_self_play_seats_said_once(tokenizer, tmp_path, capsys):
    pool._SAID.clear()
    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"3:{t}"} for t in range(2)], 2)
    episodes = run(tokenizer, tasks, tmp_path)
    for a, b in zip(episodes[::2], episodes[1::2]):  # the two seats of one game: one game's returns
        assert a.trajectory.turns[-1].info["returns"] == b.trajectory.turns[-1].info["returns"]
        assert a.trajectory.turns[0].info["selfplay"] and "pool_step" not in a.trajectory.turns[0].info
    run(tokenizer, tasks, tmp_path)
    said = capsys.readouterr().out
    assert said.count("opponent=pool has no snapshot of the policy before step 3 yet") == 1
    # validation rows play val_opponent, as with opponent=self
    env = OpenSpielEnv(game="kuhn_poker", opponent="pool", pool_dir=str(tmp_path))
    env.start_task({"task_id": 1, "seed": 0, "split": "val", "group_id": "val:0", "sample_index": 0})
    assert env._table is None and type(env._opponents[0]).__name__ == "RandomOpponent"


def _cfg(run_dir, **kwargs):
    return SimpleNamespace(env=SimpleNamespace(name="openspiel", kwargs={
        "game": "kuhn_poker", "opponent": "pool", "pool_dir": str(run_dir), "refresh_steps": 25, **kwargs}))


def test_a_validation_at_a_refresh_step_keeps_the_scored_policy_and_eval_keeps_none(tokenizer, tmp_path):
    template = build("template", {"name": "react", "kwargs": {}})
    bet = tokenizer.encode("Bet", add_special_tokens=False)

    def score(prompts, continuations):  # prefers Bet 3:1 wherever it is legal
        return [0.0 if any(t in c for t in bet) else -1.0986123 for c in continuations]

    scorer = PolicyScorer(tokenizer, template, score)
    hooks._TRAINING.clear()
    hooks.openmanus_rl_policy_metrics(cfg=_cfg(tmp_path), policy=scorer)  # eval: no training run in this process
    assert pool.snapshots(tmp_path) == []
    hooks.openmanus_rl_run_start(cfg=None, run_dir=str(tmp_path))
    values = hooks.openmanus_rl_policy_metrics(cfg=_cfg(tmp_path), policy=scorer)  # step 0's validation
    assert 0 < values["exploitability"] < 2
    hooks.openmanus_rl_process_trajectories(trajectories=[], step=25)
    hooks.openmanus_rl_policy_metrics(cfg=_cfg(tmp_path), policy=scorer)
    hooks.openmanus_rl_process_trajectories(trajectories=[], step=30)  # not a refresh step
    hooks.openmanus_rl_policy_metrics(cfg=_cfg(tmp_path), policy=scorer)
    hooks.openmanus_rl_run_end(run_dir=str(tmp_path), metrics={})
    hooks.openmanus_rl_process_trajectories(trajectories=[], step=50)  # after the run: no training step
    hooks.openmanus_rl_policy_metrics(cfg=_cfg(tmp_path), policy=scorer)
    assert pool.snapshots(tmp_path) == [0, 25]
    body = json.loads((tmp_path / "step_25.json").read_text())
    assert body["step"] == 25 and len(body["table"]) == 12  # kuhn_poker's information states
    for player, info, probs in body["table"]:
        assert probs == pytest.approx({str(PASS): 0.25, str(BET): 0.75})


@pytest.mark.parametrize("override, line", [
    ("env.kwargs.game=tic_tac_toe env.kwargs.max_turns=5", r"^env\.kwargs\.opponent=pool: tic_tac_toe: a pool seat "
                                                           r"plays a stored table"),
    ("env.kwargs.pool_size=0", r"^env\.kwargs\.pool_size=0: must be a positive integer"),
    ("env.kwargs.refresh_steps=10", r"^env\.kwargs\.refresh_steps=10: opponent=pool takes its snapshots at "
                                    r"validations, so it must be a multiple of trainer\.val_freq \(25\)"),
])
def test_bad_pool_settings_are_one_line(override, line, tmp_path):
    args = ["+experiment=kuhn_selfplay", "env.kwargs.opponent=pool",
            *override.replace("env.kwargs.max_turns", "env.max_turns").split()]
    with pytest.raises(ConfigError, match=line) as err:
        load(args, training=True)
    assert "\n" not in str(err.value)


def test_the_pool_lives_in_the_run_folder_unless_pool_dir_is_set(tmp_path):
    """Nothing to set: the env service puts the pool under the training run's folder; a pool_dir given is kept,
    made absolute (the workers find it whatever their working folder); no run (eval, rollout): no folder."""
    from openmanus_rl_core.plugin.envs import open_env_service

    cfg = load(["+experiment=kuhn_selfplay", "env.kwargs.opponent=pool"], training=True)
    assert cfg.env.kwargs["pool_dir"] is None
    served = open_env_service("openspiel", OpenSpielEnv, cfg.env.kwargs, at_once=8, run_dir=tmp_path / "run")
    assert served.kwargs["pool_dir"] == str((tmp_path / "run" / "pool").resolve())
    assert open_env_service("openspiel", OpenSpielEnv, cfg.env.kwargs).kwargs["pool_dir"] is None
    given = load(["+experiment=kuhn_selfplay", "env.kwargs.opponent=pool", "env.kwargs.pool_dir=rel/pool"],
                 training=True)
    assert open_env_service("openspiel", OpenSpielEnv, given.env.kwargs, run_dir=tmp_path).kwargs["pool_dir"] == str(
        (Path.cwd() / "rel/pool").resolve())
    self_play = load(["+experiment=kuhn_selfplay"], training=True)  # no pool: no folder
    assert open_env_service("openspiel", OpenSpielEnv, self_play.env.kwargs, run_dir=tmp_path).kwargs["pool_dir"] is None


def test_a_checkpoint_keeps_the_pool_and_a_resume_puts_exactly_that_back(tmp_path):
    """The checkpoint of step C holds the bytes of the snapshots up to C (the hook plugin's entry); restoring it
    writes back a snapshot deleted or altered since, removes those of later steps (a killed attempt's), and tells
    a pool seat's reader the file changed."""
    from openmanus_rl_core.plugin.manager import make_plugin_manager

    folder = tmp_path / "run" / "pool"
    cfg = SimpleNamespace(env=SimpleNamespace(name="openspiel", kwargs={"game": "kuhn_poker", "opponent": "pool",
                                                                          "pool_dir": str(folder)}))
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(hooks)
    for step in (0, 2, 4):
        pool.write_snapshot(folder, step, "kuhn_poker", always(BET if step else PASS))
    before = {s: (folder / f"step_{s}.json").read_bytes() for s in (0, 2)}
    [state] = pm.hook.openmanus_rl_checkpoint_save(cfg=cfg, run_dir=str(tmp_path / "run"), step=3)
    assert state == {hooks.CHECKPOINT_KEY: {"snapshots": before}}
    assert pool.load(folder, 2) == always(BET)
    (folder / "step_0.json").unlink()
    pool.write_snapshot(folder, 2, "kuhn_poker", always(PASS))  # altered since the checkpoint
    pool.write_snapshot(folder, 6, "kuhn_poker", always(PASS))
    pm.hook.openmanus_rl_checkpoint_restore(cfg=cfg, run_dir=str(tmp_path / "run"), step=3, state=state)
    assert pool.snapshots(folder) == [0, 2]
    assert {s: (folder / f"step_{s}.json").read_bytes() for s in (0, 2)} == before
    assert pool.load(folder, 2) == always(BET)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left
    # a run without a pool keeps nothing, and a checkpoint without the entry leaves the folder alone
    plain = SimpleNamespace(env=SimpleNamespace(name="openspiel", kwargs={"game": "kuhn_poker", "opponent": "self"}))
    assert pm.hook.openmanus_rl_checkpoint_save(cfg=plain, run_dir=str(tmp_path), step=3) == []
    pool.write_snapshot(folder, 6, "kuhn_poker", always(PASS))
    pm.hook.openmanus_rl_checkpoint_restore(cfg=cfg, run_dir=str(tmp_path / "run"), step=3, state={})
    assert pool.snapshots(folder) == [0, 2, 6]
