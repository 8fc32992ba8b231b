"""Self-play (``opponent=self``): through the real rollout loop (``rollout.mode=episodes``), the samples of a group
are the seats of shared games, each seat its own trajectory with its own return (opposite in a zero-sum game); what
each seat is shown is the game as that seat sees it; the lockstep loop is refused by a timeout that says why;
validation rows play ``val_opponent``; the trajectories carry their role and GRPO groups per seat; and the
preset trains both seats from the command line and logs the policy's exploitability."""

from __future__ import annotations

import random
import re

import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.manager import make_plugin_manager
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks
from openmanus_rl_core.testing import ScriptedEngine
from openmanus_rl_env_openspiel import OpenSpielEnv, games, hooks, tables
from openmanus_rl_env_openspiel.env import NO_MOVE


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["Game: kuhn_poker tic_tac_toe Pass Bet <action></action> player Legal actions"] * 4,
                           vocab_size=400)


def legal(prompt: str) -> list[str]:
    return re.findall(r"Legal actions: ([^<\n]*)", prompt)[-1].split(", ")


def random_replies(seed: int):
    rng = random.Random(seed)
    return lambda prompt: f"<action>{rng.choice(legal(prompt))}</action>"


def run(tokenizer, tasks, replies, mode="episodes", rollout=(), **kwargs):
    template = build("template", {"name": "react", "kwargs": {}})
    env_kwargs = {"game": "kuhn_poker", "opponent": "self", **kwargs}
    loop = AgentLoop(ScriptedEngine(tokenizer, replies), tokenizer, template, lambda: OpenSpielEnv(**env_kwargs),
                     RolloutConfig(max_turns=6, mode=mode, gen_wait_ms=5, max_new_tokens=32, **dict(rollout)))
    return loop.run(tasks)


def test_the_samples_of_a_group_are_the_seats_of_shared_games_each_with_its_own_return(tokenizer):
    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"g{t}"} for t in range(6)], 4)
    episodes = run(tokenizer, tasks, random_replies(0))
    assert len(episodes) == 24 and all(e.trajectory.termination == "done" for e in episodes)
    assert not tables.TABLES  # every table is forgotten once its seats closed
    for game in range(12):  # sample k: seat k % 2 of game k // 2 of its group
        a, b = episodes[2 * game], episodes[2 * game + 1]
        seats = [e.trajectory.turns[0].info["seat"] for e in (a, b)]
        assert seats == [0, 1]
        last = [e.trajectory.turns[-1].info for e in (a, b)]
        assert last[0]["returns"] == last[1]["returns"]  # one game
        assert [e.trajectory.env_reward for e in (a, b)] == last[0]["returns"] and sum(last[0]["returns"]) == 0
        # each seat saw its own card and never the other's: its first prompt holds its information state
        first = [e.trajectory.initial_observation for e in (a, b)]
        assert first[0].startswith("Game: kuhn_poker. You are player 0 of 2.")
        assert first[1].startswith("Game: kuhn_poker. You are player 1 of 2.")
        moves = [re.search(r"Moves so far: (.*)", f).group(1) for f in first]
        assert moves[0] == "none" and moves[1].startswith("player 0: ")
        # seat 1's first observation shows seat 0's first move, as it was played
        assert moves[1] == f"player 0: {a.trajectory.turns[0].action.content}"
    # every game of a group is dealt from the task: seat 0 holds the same card in each
    cards = {t: {re.search(r"sees it\):\n(\d)", e.trajectory.initial_observation).group(1)
                 for e in episodes[4 * t: 4 * t + 4:2]} for t in range(6)}
    assert all(len(c) == 1 for c in cards.values()) and len({c.pop() for c in cards.values()}) > 1


def test_a_seat_that_never_gets_its_turn_ends_with_an_error_that_says_why(tokenizer):
    # lockstep resets every env at once: seat 1 waits for seat 0's move, which comes only after every reset
    tasks = expand_tasks([{"task_id": 1, "seed": 0, "split": "train", "group_id": "g"}], 2)
    episodes = run(tokenizer, tasks, random_replies(1), mode="lockstep", seat_timeout_s=0.5)
    errors = [e.trajectory for e in episodes if e.trajectory.termination == "env_error"]
    assert errors and "opponent=self needs rollout.mode=episodes, rollout.n a multiple of 2" in errors[0].error
    # one seat alone (rollout.n=1) waits for a seat that never comes
    alone = run(tokenizer, expand_tasks([{"task_id": 3, "seed": 0, "split": "train", "group_id": "h"}], 1),
                random_replies(2), seat_timeout_s=0.5)
    assert alone[0].trajectory.termination == "env_error" and len(alone[0].trajectory.turns) == 1
    assert "waited 0.5s for the other seats before its next move" in alone[0].trajectory.error
    tables.TABLES.clear()


def test_validation_rows_and_single_episodes_play_the_val_opponent():
    env = OpenSpielEnv(game="tic_tac_toe", opponent="self", val_opponent="bot:minimax")
    first = env.start_task({"task_id": 1, "seed": 0, "split": "val", "group_id": "val:0", "sample_index": 0})
    assert first.startswith("Game: tic_tac_toe. You are player 1 of 2.") and "player 0: x(" in first
    assert env._table is None and set(env._opponents) == {0}
    env.reset(task_id=2)  # the warm-up's episodes: no group, no table
    assert env._table is None and env.oracle_action() in [f"x({r},{c})" for r in range(3) for c in range(3)]


def _moves(observation: str) -> list[str]:
    """The moves an observation lists: the moves so far, or a finished game's moves."""
    listed = re.search(r"Moves(?: so far)?: (.*)", observation).group(1)
    return [] if listed == "none" else listed.split("; ")


def replies_or_none(seed: int):
    """Random legal moves, and the one reply there is where the game ended before the seat's first move."""
    rng = random.Random(seed)
    return lambda prompt: (f"<action>{rng.choice(legal(prompt))}</action>"
                           if "Legal actions: " in prompt.rsplit("<|im_start|>user", 1)[-1] else "<action>none</action>")


def test_training_games_open_with_random_moves_shared_by_a_group_and_validation_games_never(tokenizer):
    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"g{t}"} for t in range(16)], 4)
    # the tokenizer is the Kuhn tests': a board takes many tokens, so room for whole observations
    episodes = run(tokenizer, tasks, replies_or_none(2), rollout={"max_obs_tokens": 1024,
                                                                 "max_response_tokens": 8192},
                   game="tic_tac_toe", opening_moves=4)
    assert all(e.trajectory.termination == "done" for e in episodes) and not tables.TABLES
    openings = []
    for t in range(16):
        games_of_task = []
        for game in range(2):
            a, b = episodes[4 * t + 2 * game], episodes[4 * t + 2 * game + 1]
            first = [_moves(e.trajectory.initial_observation) for e in (a, b)]
            # the seat first to move after the opening sees the opening alone; the other sees it and that move
            mover = 0 if len(first[0]) <= len(first[1]) else 1
            opening = first[mover]
            assert len(opening) % 2 == mover and first[1 - mover][:len(opening)] == opening
            # the other seat's first view is one move on (or the game that move ended)
            assert len(first[1 - mover]) == len(opening) + 1
            # the opening's moves alternate from player 0, as a game's do
            assert [m.split(":")[0] for m in opening] == [f"player {i % 2}" for i in range(len(opening))]
            games_of_task.append(opening)
        assert games_of_task[0] == games_of_task[1]  # a group's games open alike: its mean is the position's value
        openings.append(tuple(games_of_task[0]))
    assert {len(o) for o in openings} >= {0, 1, 2, 3} and max(len(o) for o in openings) <= 4
    assert len(set(openings)) >= 12  # the tasks open differently
    # validation and the warm-up's single episodes start from the game's first position
    env = OpenSpielEnv(game="tic_tac_toe", opponent="self", opening_moves=4)
    for t in range(6):
        first = env.start_task({"task_id": t, "seed": 0, "split": "val", "group_id": "val:0", "sample_index": 0})
        assert len(_moves(first)) == t % 2  # seat 1 sees the random opponent's first move only
        assert len(_moves(env.reset(task_id=t))) == t % 2
    # against fixed opponents, a training row opens the same way
    fixed = OpenSpielEnv(game="tic_tac_toe", opponent="random", opening_moves=4)
    seen = {len(_moves(fixed.start_task({"task_id": t, "seed": 0, "split": "train", "group_id": f"g{t}",
                                         "sample_index": 0}))) for t in range(16)}
    assert max(seen) >= 4


def test_a_seat_whose_game_ended_before_it_moved_has_one_reply_that_decides_nothing():
    env = OpenSpielEnv(game="tic_tac_toe", opponent="random", opening_moves=4)
    for task in range(400):  # seat 1 (odd tasks) after an opening of 4: the random x may win at once
        first = env.start_task({"task_id": 2 * task + 1, "seed": 0, "split": "train", "group_id": "g",
                                "sample_index": 0})
        if first.startswith("Game: tic_tac_toe. You are player 1 of 2.\nThe game is over."):
            break
    else:
        pytest.fail("no opening of 400 let the opponent win before seat 1 moved")
    assert len(_moves(first)) == 5 and env.action_choices() == [NO_MOVE]
    result = env.step(NO_MOVE)
    assert result.done and result.reward == -1.0 and env.action_choices() is None


def test_an_opening_never_ends_the_game():
    stopped = 0
    for number in range(20):
        state = games.load("tic_tac_toe").new_initial_state()
        played = games.play_opening(state, 20, number, random.Random(0))
        assert not state.is_terminal() and played == len(state.history()) <= 8
        stopped += all(state.child(a).is_terminal() for a in state.legal_actions())
    assert stopped >= 5  # openings drawn longer than the game allows stop where every move would end it


@pytest.mark.parametrize("override, line", [
    ("env.kwargs.opponent=self env.kwargs.val_opponent=bot:minimax",
     r"^env\.kwargs\.val_opponent=bot:minimax: kuhn_poker: bot:minimax searches two-player zero-sum"),
    ("env.kwargs.opponent=pool env.kwargs.game=tic_tac_toe", r"^env\.kwargs\.opponent=pool: tic_tac_toe: a pool seat plays a stored table"),
    ("env.kwargs.opponent=[self]", r"^env\.kwargs\.opponent=\['self'\]: self plays every seat"),
    ("env.kwargs.seat_timeout_s=0", r"^env\.kwargs\.seat_timeout_s=0: must be a positive number"),
    ("env.kwargs.opening_moves=-1", r"^env\.kwargs\.opening_moves=-1: must be a whole number of plies, 0 or more"),
])
def test_bad_self_play_settings_are_one_line(override, line):
    with pytest.raises(ConfigError, match=line):
        load(["env=openspiel", *override.split()], training=False)


def test_the_hook_names_each_trajectorys_role_and_groups_self_play_seats_apart(tokenizer):
    tasks = expand_tasks([{"task_id": 4, "seed": 0, "split": "train", "group_id": "s:0"}], 4)
    episodes = run(tokenizer, tasks, random_replies(3))
    fixed = run(tokenizer, expand_tasks([{"task_id": 5, "seed": 0, "split": "val", "group_id": "v"}], 2),
                random_replies(4))
    trajs = [e.trajectory for e in episodes + fixed]
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(hooks)
    pm.hook.openmanus_rl_process_trajectories(trajectories=trajs, step=1)
    assert [t.info["role"] for t in trajs] == ["kuhn_poker:seat0", "kuhn_poker:seat1"] * 2 + ["kuhn_poker:seat1"] * 2
    assert [t.group_id for t in trajs] == (["s:0|kuhn_poker:seat0", "s:0|kuhn_poker:seat1"] * 2
                                           + ["v|kuhn_poker:seat1"] * 2)
    cut = run(tokenizer, expand_tasks([{"task_id": 6, "seed": 0, "split": "train", "group_id": "c"}], 2),
              lambda prompt: "<action>Raise</action>")  # never a legal action: seat 0 forfeits, never having moved
    # seat 0 forfeits on its third invalid reply, and seat 1 starts on the game's end, its role still readable
    assert [t.info["invalid"] for t in cut[0].trajectory.turns] == [True] * 3 and cut[0].trajectory.turns[-1].done
    assert "The game is over: player 0 forfeited it" in cut[1].trajectory.initial_observation
    pm.hook.openmanus_rl_process_trajectories(trajectories=[e.trajectory for e in cut], step=2)
    assert [e.trajectory.info["role"] for e in cut] == ["kuhn_poker:seat0", "kuhn_poker:seat1"]
    assert [e.trajectory.group_id for e in cut] == ["c|kuhn_poker:seat0", "c|kuhn_poker:seat1"]
    pm.hook.openmanus_rl_process_trajectories(trajectories=trajs, step=1)  # once only
    assert trajs[0].group_id == "s:0|kuhn_poker:seat0"


SMALL = ["trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=1", "trainer.num_workers=1",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
         "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=2", "algorithm.n=4",
         "env.train_tasks=32", "model.corpus_tasks=8", "warmup.steps=30", "warmup.num_demos=32",
         "warmup.validate=false", "trainer.save_at_end=true", "trainer.val_freq=2", "trainer.save_rollouts=true"]


@pytest.mark.slow
def test_the_kuhn_preset_trains_both_seats_from_the_command_line_and_logs_exploitability(tmp_path, ray_local,
                                                                                         command_here):
    """Two steps of +experiment=kuhn_selfplay (made small): every training episode is one seat of a shared game
    (no env errors, at most one winner a game: the game is zero-sum), validation logs OpenSpiel's exploitability of the
    model's policy, and eval prints the same value from the checkpoint."""
    run = tmp_path / "run"
    proc = command_here(["train", "+experiment=kuhn_selfplay", "trainer.total_steps=2", *SMALL,
                         f"trainer.run_dir={run}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    for step in (1, 2):
        ends = [rows[step][f"rollout/termination/{k}"] for k in ("done", "truncated", "max_turns", "env_error")]
        assert sum(ends) == 8 and ends[3] == 0, ends  # a cut reply ends its seat (and forfeits), not the run
        assert rows[step]["train/success_rate"] <= 0.5  # one winner a game at most (a forfeit: none)
    for step in (0, 2):
        assert 0.0 <= rows[step]["val/exploitability"] <= 2.0
        assert rows[step]["val/nash_conv"] == pytest.approx(2 * rows[step]["val/exploitability"])
    import pyarrow.parquet as pq

    dump = pq.read_table(run / "rollouts" / "step_000002.parquet").to_pydict()  # each seat's samples, the seat named
    assert sorted(dump["role"]) == ["kuhn_poker:seat0"] * 4 + ["kuhn_poker:seat1"] * 4
    assert all(g.endswith("|" + r) for g, r in zip(dump["group_id"], dump["role"]))
    out = command_here(["eval", f"trainer.checkpoint={run}"])
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("policy: "))
    assert float(line.split("exploitability ")[1].split(",")[0]) == pytest.approx(rows[2]["val/exploitability"],
                                                                               abs=1e-3)


@pytest.mark.slow
def test_the_kl_over_each_choice_trains_from_the_command_line_and_its_reference_is_in_the_dump(tmp_path, ray_local,
                                                                                             command_here):
    """``rollout.constrain_actions=true algorithm.choice_kl_coeff``: the reference's log-probs of every allowed
    token reach the update (the dump holds what it read: a distribution over each choice), and ``actor/choice_kl``
    is 0 at the first step, where the policy is its reference, and above 0 once an update has moved it."""
    run = tmp_path / "run"
    proc = command_here(["train", "+experiment=kuhn_selfplay", "trainer.total_steps=2", *SMALL,
                         "rollout.constrain_actions=true", "algorithm.choice_kl_coeff=0.5", f"trainer.run_dir={run}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    import numpy as np
    import pyarrow.parquet as pq

    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert rows[1]["actor/choice_kl"] == pytest.approx(0.0, abs=1e-6) and 0.0 < rows[2]["actor/choice_kl"] < 1.0
    table = pq.read_table(run / "rollouts" / "step_000002.parquet")
    shape = json.loads(table.schema.metadata[b"openmanus_rl"])["shapes"]
    ids = np.array(table["choice_ids"].to_pylist()).reshape(-1, *shape["choice_ids"])
    ref = np.array(table["ref_choice_log_probs"].to_pylist()).reshape(-1, *shape["ref_choice_log_probs"])
    chose = (ids >= 0).sum(-1) >= 2  # Pass or Bet
    assert chose.sum() >= 8 and np.allclose(np.where(ids >= 0, np.exp(ref), 0).sum(-1)[chose], 1.0, atol=1e-5)


@pytest.mark.parametrize("override, line", [
    ("rollout.mode=lockstep", r"^rollout\.mode=lockstep: env\.kwargs\.opponent=self needs rollout\.mode=episodes"),
    ("algorithm.n=3", r"^rollout\.n=3: env\.kwargs\.opponent=self plays one sample per seat, and kuhn_poker has 2 "
                      r"seats"),
    ("trainer.num_workers=2 data.train_batch_size=1 algorithm.n=2", r"^trainer\.num_workers=2: the seats of a game "
                                                                     r"play on one actor rank"),
])
def test_the_preset_refuses_a_rollout_self_play_cannot_run_in_one_line(override, line):
    with pytest.raises(ConfigError, match=line) as err:
        load(["+experiment=kuhn_selfplay", *override.split()], training=True)
    assert "\n" not in str(err.value)
    load(["+experiment=kuhn_selfplay"], training=True)  # the preset itself passes


def test_the_state_baseline_compares_each_seats_moves_at_the_same_information_state_across_deals(tokenizer):
    """``algorithm.adv_estimator=state_baseline`` on real self-play episodes: a turn's baseline comes from the other
    turns of its seat at the same observation, which is the seat's information state (its card and the moves so far),
    so the first moves of one seat holding one card are compared with each other across deals."""
    from openmanus_rl_core.plugin.registry import registry
    from openmanus_rl_core.rollout.assembly import build_batch

    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"g{t}"} for t in range(16)], 4)
    episodes = run(tokenizer, tasks, random_replies(5))
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(hooks)
    pm.hook.openmanus_rl_process_trajectories(trajectories=[e.trajectory for e in episodes], step=1)  # the roles
    batch = build_batch(episodes, None, build("allocator", {"name": "last_token", "kwargs": {}}), pad_token_id=0)
    adv = registry("advantage").get("state_baseline")(batch)[0]
    firsts: dict[tuple, list[tuple[float, float]]] = {}  # (role, first observation) -> (return, advantage) of each
    for i, e in enumerate(episodes):
        obs = batch["anchor_obs"][i][0]
        assert obs == e.trajectory.initial_observation and batch["roles"][i] == f"kuhn_poker:seat{i % 2}"
        first_turn = batch["step_ids"][i] == 0
        values = set(adv[i][first_turn].tolist())
        assert len(values) == 1  # one advantage on every token of the turn
        firsts.setdefault((batch["roles"][i], obs), []).append((e.trajectory.env_reward, values.pop()))
    # seat 0 opens with one of three cards and no moves: three states, each seen in several deals
    seat0 = {obs: turns for (role, obs), turns in firsts.items() if role.endswith("seat0")}
    assert len(seat0) == 3 and all(len(turns) >= 4 for turns in seat0.values())
    for turns in seat0.values():  # each return against the mean of the others at the same state
        returns = [r for r, _ in turns]
        for k, (r, a) in enumerate(turns):
            others = returns[:k] + returns[k + 1:]
            assert a == pytest.approx(r - sum(others) / len(others))
