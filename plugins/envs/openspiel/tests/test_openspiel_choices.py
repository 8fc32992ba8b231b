"""``rollout.constrain_actions=true`` on OpenSpiel games: the env's ``action_choices()`` are the legal actions of the
seat to move, and the real ``hf`` engine under the rollout loop then writes only legal actions, in the react
template's form, where the same untrained model replying freely almost never names one."""

from __future__ import annotations

import re

import pytest

from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks
from openmanus_rl_env_openspiel import OpenSpielEnv, games, tables

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    env = OpenSpielEnv(game="tic_tac_toe")
    texts = [env.instruction, env.reset(task_id=0), "<action>x(0,0)</action> o(2,2) <think></think>"] * 3
    return build_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            seed=3)


def play(model, tok, env_kwargs, tasks, constrain, mode="lockstep"):
    template = build("template", {"name": "react", "kwargs": {}})
    cfg = RolloutConfig(max_turns=8, mode=mode, gen_wait_ms=5, max_new_tokens=24, max_obs_tokens=256,
                        max_response_tokens=2048, constrain_actions=constrain)
    loop = AgentLoop(HFEngine(model, tok, seed=0, num_threads=1), tok, template,
                     lambda: OpenSpielEnv(**env_kwargs), cfg)
    return loop.run(tasks), template


def test_action_choices_are_the_legal_actions_of_the_seat_to_move_and_none_once_over():
    env = OpenSpielEnv(game="tic_tac_toe", opponent="random", seat=1)
    first = env.reset(task_id=4)
    assert env.action_choices() == re.search(r"Legal actions: (.*)", first).group(1).split(", ")
    assert len(env.action_choices()) == 8 and all(c.startswith("o(") for c in env.action_choices())
    while not (result := env.step(env.action_choices()[0])).done:
        assert env.action_choices() == games.legal_texts(env.state, 1)
    assert env.action_choices() is None
    kuhn = OpenSpielEnv(game="kuhn_poker", seat=0)
    kuhn.reset(task_id=2)
    assert kuhn.action_choices() == ["Pass", "Bet"]


@pytest.mark.parametrize("mode", ["lockstep", "episodes"])
def test_every_constrained_reply_is_a_legal_action_where_free_ones_are_not(model, tok, mode):
    tasks = [{"task_id": t, "seed": 0} for t in range(6)]
    free, _ = play(model, tok, {"game": "tic_tac_toe", "opponent": "random"}, tasks, constrain=False, mode=mode)
    invalid = sum(bool(tr.info.get("invalid")) for e in free for tr in e.trajectory.turns)
    assert invalid >= len(free)  # an untrained model: most free replies name no legal action

    held, template = play(model, tok, {"game": "tic_tac_toe", "opponent": "random"}, tasks, constrain=True,
                          mode=mode)
    assert all(e.trajectory.termination == "done" for e in held)
    for e in held:
        for t, tr in enumerate(e.trajectory.turns):
            assert not tr.info["invalid"]
            assert re.fullmatch(r"<action>[xo]\(\d,\d\)</action>", tr.response)
            shown = re.search(r"Legal actions: (.*)", e.anchor_obs[t]).group(1).split(", ")
            assert template.parse(tr.response).content in shown
        assert sorted(e.trajectory.turns[-1].info["returns"]) in ([-1.0, 1.0], [0.0, 0.0])


def test_the_wrapper_is_forced_and_only_the_choice_is_sampled(model, tok):
    episodes, _ = play(model, tok, {"game": "kuhn_poker", "opponent": "random"},
                       [{"task_id": t, "seed": 0} for t in range(4)], constrain=True)
    for e in episodes:
        for tr in e.trajectory.turns:
            start, end = tr.span
            ids, lps = e.response_ids[start:end], e.logprobs[start:end]
            pieces = [tok.decode([i]) for i in ids]
            # "<action>" comes first and "</action>" (the stop string) last, each token the only one allowed
            opening = next(k for k in range(len(pieces)) if "".join(pieces[:k + 1]) == "<action>")
            assert all(lp == 0.0 for lp in lps[:opening + 1])
            assert tr.response in ("<action>Pass</action>", "<action>Bet</action>")
            assert any(lp < 0 for lp in lps)  # the choice between two actions is drawn, not forced


def test_self_play_seats_reply_within_their_own_legal_actions(model, tok):
    tasks = expand_tasks([{"task_id": t, "seed": 0, "split": "train", "group_id": f"g{t}"} for t in range(3)], 2)
    episodes, template = play(model, tok, {"game": "tic_tac_toe", "opponent": "self"}, tasks, constrain=True,
                              mode="episodes")
    assert all(e.trajectory.termination == "done" for e in episodes) and not tables.TABLES
    for e in episodes:
        mark = "x" if e.trajectory.turns[0].info["seat"] == 0 else "o"
        assert all(template.parse(tr.response).content.startswith(mark) and not tr.info["invalid"]
                   for tr in e.trajectory.turns)
