"""env=textarena's two-player games in self-play (``opponent=self``), on the real TextArena and the real rollout loop
(``rollout.mode=episodes``): the samples of a group are the seats of shared TicTacToe games, each seat sees only the
other's moves and its own messages, the seats' rewards are one game's (a win and a loss, or a draw); validation rows
play ``val_opponent``; a seat that leaves ends the game for the other; bad settings are one line."""

from __future__ import annotations

import random
import re

import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks
from openmanus_rl_core.testing import ScriptedEngine
from openmanus_rl_env_textarena import TextArenaEnv, hooks, tables
from openmanus_rl_env_textarena.opponents import listed_moves


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["[GAME] Player TicTacToe Available Moves <action></action> [0] [1] [2] [3] [4]"] * 4,
                           vocab_size=400)


def run(tokenizer, tasks, seed, mode="episodes", **kwargs):
    rng = random.Random(seed)

    def reply(prompt: str) -> str:  # a random move among those the game last listed to this seat
        moves = listed_moves([prompt])
        assert moves, prompt[-300:]
        return f"<action>{rng.choice(moves)}</action>"

    template = build("template", {"name": "react", "kwargs": {}})
    env_kwargs = {"game": "TicTacToe-v0", "opponent": "self", **kwargs}
    loop = AgentLoop(ScriptedEngine(tokenizer, reply), tokenizer, template, lambda: TextArenaEnv(**env_kwargs),
                     RolloutConfig(max_turns=8, mode=mode, gen_wait_ms=5, max_new_tokens=32, max_obs_tokens=4096,
                                   max_response_tokens=16384))
    return loop.run(tasks)


def test_the_samples_of_a_group_are_the_two_seats_of_shared_tic_tac_toe_games(tokenizer):
    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"g{t}"} for t in range(3)], 4)
    episodes = run(tokenizer, tasks, 0)
    assert len(episodes) == 12 and not tables.TABLES
    outcomes = set()
    for a, b in zip(episodes[::2], episodes[1::2]):
        assert a.trajectory.termination == b.trajectory.termination == "done", (a.trajectory.error, b.trajectory.error)
        assert "You are Player 0" in a.trajectory.initial_observation
        assert "You are Player 1" in b.trajectory.initial_observation
        # seat 1 opens on seat 0's first move, as seat 0 played it
        first = re.findall(r"^\[Player 0\] (\[\d\])$", b.trajectory.initial_observation, re.MULTILINE)
        assert first == [a.trajectory.turns[0].action.content]
        # each seat sees the other's moves, never its own echoed
        assert "[Player 0]" not in "".join(t.observation for t in a.trajectory.turns)
        assert "[Player 1]" not in b.trajectory.initial_observation + "".join(t.observation for t in b.trajectory.turns)
        rewards = (a.trajectory.env_reward, b.trajectory.env_reward)
        assert rewards in {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}, rewards  # one game: a win and a loss, or a draw
        moves = len(a.trajectory.turns) + len(b.trajectory.turns)
        assert 5 <= moves <= 9 + sum(t.info["invalid"] for t in a.trajectory.turns + b.trajectory.turns)
        outcomes.add(tuple(t.action.content for t in a.trajectory.turns + b.trajectory.turns))
    # six games of random moves: distinct games, not one game replayed (their results may well all be alike: the
    # opening seat wins most random games)
    assert len(outcomes) >= 2
    trajs = [e.trajectory for e in episodes]
    hooks.openmanus_rl_process_trajectories(trajectories=trajs, step=1)
    assert [t.info["role"] for t in trajs] == ["TicTacToe-v0:seat0", "TicTacToe-v0:seat1"] * 6
    assert [t.group_id for t in trajs[:4]] == ["g0|TicTacToe-v0:seat0", "g0|TicTacToe-v0:seat1"] * 2
    hooks.openmanus_rl_process_trajectories(trajectories=trajs, step=1)  # once only
    assert trajs[0].group_id == "g0|TicTacToe-v0:seat0"


def test_validation_rows_play_the_val_opponent_and_a_seat_that_leaves_ends_the_game():
    env = TextArenaEnv(game="TicTacToe-v0", opponent="self")
    first = env.start_task({"task_id": 1, "seed": 0, "split": "val", "group_id": "val:0", "sample_index": 0})
    assert env._table is None and "You are Player 1" in first and re.search(r"^\[Player 0\] \[\d\]$", first, re.M)
    a, b = TextArenaEnv(game="TicTacToe-v0", opponent="self"), TextArenaEnv(game="TicTacToe-v0", opponent="self")
    row = {"task_id": 2, "seed": 0, "split": "train", "group_id": "x"}
    a.start_task({**row, "sample_index": 0})
    a.close()  # seat 0 leaves before its move: seat 1, waiting for it, starts on the game's end
    b.start_task({**row, "sample_index": 1})
    result = b.step("[4]")
    assert result.done and result.reward == 0.0 and result.info["forfeit_by"] == 0
    b.close()
    assert not tables.TABLES


def test_lockstep_waits_are_cut_by_a_timeout_that_says_why(tokenizer):
    tasks = expand_tasks([{"task_id": 1, "seed": 0, "split": "train", "group_id": "g"}], 2)
    episodes = run(tokenizer, tasks, 1, mode="lockstep", seat_timeout_s=0.5)
    errors = [e.trajectory.error for e in episodes if e.trajectory.termination == "env_error"]
    assert errors and "opponent=self needs rollout.mode=episodes, rollout.n even" in errors[0]
    tables.TABLES.clear()


BASE = "env=textarena env.kwargs.game=TicTacToe-v0 env.kwargs.opponent=self"


@pytest.mark.parametrize("override, line", [
    ("rollout.mode=lockstep", r"^rollout\.mode=lockstep: env\.kwargs\.opponent=self needs rollout\.mode=episodes"),
    ("rollout.mode=episodes algorithm.n=3", r"^rollout\.n=3: env\.kwargs\.opponent=self plays one sample per seat"),
    ("rollout.mode=episodes env.kwargs.val_opponent=self", r"^env\.kwargs\.val_opponent=self: validation plays a "
                                                           r"fixed opponent"),
    ("rollout.mode=episodes env.kwargs.game=GuessTheNumber-v0", r"^env\.kwargs\.opponent=self: GuessTheNumber-v0 is "
                                                                r"a single-player game"),
])
def test_bad_self_play_settings_are_one_line(override, line):
    with pytest.raises(ConfigError, match=line) as err:
        load([*BASE.split(), *override.split()], training=True)
    assert "\n" not in str(err.value)
    load([*BASE.split(), "rollout.mode=episodes", "algorithm.n=4"], training=True)
