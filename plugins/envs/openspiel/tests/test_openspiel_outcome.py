"""``openspiel_outcome`` (reward=openspiel's weight-0 ``outcome``): through the real rollout loop and the run's own
reward config, it counts each seat's wins, draws and losses as the games' returns say, non-loss per seat over that
seat's episodes only, an episode cut before the game's end as unfinished (never a draw), and it adds nothing to the
reward trained on; the tic-tac-toe preset composes and validates against MCTS."""

from __future__ import annotations

import random
import re

import pytest

from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks
from openmanus_rl_core.testing import ScriptedEngine
from openmanus_rl_env_openspiel import OpenSpielEnv


LEGAL = re.compile(r"Legal actions: ([^<\n]*)")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["Game: tic_tac_toe x(0,0) o(1,1) <action></action> player Legal actions"] * 4,
                           vocab_size=400)


def random_replies(seed: int):
    rng = random.Random(seed)
    return lambda prompt: f"<action>{rng.choice(LEGAL.findall(prompt)[-1].split(', '))}</action>"


def play(tokenizer, tasks: int, max_turns: int):
    template = build("template", {"name": "react", "kwargs": {}})
    loop = AgentLoop(ScriptedEngine(tokenizer, random_replies(0)), tokenizer, template,
                     lambda: OpenSpielEnv(game="tic_tac_toe", opponent="random"),
                     RolloutConfig(max_turns=max_turns, gen_wait_ms=5, max_new_tokens=32, max_obs_tokens=2048,
                                   max_prompt_tokens=4096, max_response_tokens=8192))  # a token a character or two
    rows = [{"task_id": t, "seed": 0, "split": "val", "group_id": f"val:{t}"} for t in range(tasks)]
    return [e.trajectory for e in loop.run(expand_tasks(rows, 1))]


def composer() -> RewardComposer:
    return RewardComposer.from_config(load(["env=openspiel", "reward=openspiel"], training=False).reward.components)


def test_win_draw_loss_and_non_loss_per_seat_are_the_games_returns(tokenizer):
    trajs = play(tokenizer, 40, max_turns=6)
    ends = [t.turns[-1].reward for t in trajs]  # the env's step reward at the end: the seat's return
    assert all(t.turns[-1].done for t in trajs) and {-1.0, 0.0, 1.0} <= set(ends), ends  # random play: all three
    breakdowns, metrics = composer().compose_batch(trajs)
    assert metrics["reward/outcome/win/mean"] == pytest.approx(ends.count(1.0) / 40)
    assert metrics["reward/outcome/draw/mean"] == pytest.approx(ends.count(0.0) / 40)
    assert metrics["reward/outcome/loss/mean"] == pytest.approx(ends.count(-1.0) / 40)
    assert metrics["reward/outcome/non_loss/mean"] == pytest.approx(1 - ends.count(-1.0) / 40)
    assert metrics["reward/outcome/unfinished/mean"] == 0.0
    for seat in (0, 1):  # seat = task id % 2: each seat's rate over its own 20 episodes
        own = [r for t, r in zip(trajs, ends) if t.task_id % 2 == seat]
        assert len(own) == 20
        assert metrics[f"reward/outcome/seat{seat}/non_loss/mean"] == pytest.approx(sum(r >= 0 for r in own) / 20)
        assert metrics[f"reward/outcome/seat{seat}/win/mean"] == pytest.approx(sum(r > 0 for r in own) / 20)
    # weight 0: the reward trained on is goal + format + invalid_action, as without the component
    assert metrics["reward/outcome/mean"] == 0.0
    for b in breakdowns:
        assert b.total == pytest.approx(sum(v for k, v in b.parts.items() if k != "outcome"))


def test_an_episode_cut_before_the_game_ends_is_unfinished_not_a_draw(tokenizer):
    trajs = play(tokenizer, 6, max_turns=1)  # one move a seat never ends a tic-tac-toe game
    assert all(not t.turns[-1].done for t in trajs)
    _, metrics = composer().compose_batch(trajs)
    assert metrics["reward/outcome/unfinished/mean"] == 1.0
    assert metrics["reward/outcome/non_loss/mean"] == 0.0 and metrics["reward/outcome/draw/mean"] == 0.0


def test_the_tictactoe_preset_self_plays_and_validates_against_mcts_with_room_for_every_move():
    cfg = load(["+experiment=tictactoe_selfplay"], training=True)
    kwargs = cfg.env.kwargs
    assert [kwargs[k] for k in ("game", "opponent", "val_opponent", "simulations")] == [
        "tic_tac_toe", "self", "bot:mcts", 100]
    assert cfg.env.max_turns >= 6 and cfg.rollout.n % 2 == 0 and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.reward.components["outcome"] == {"name": "openspiel_outcome", "weight": 0.0}
