"""The systematic demonstrator of GoToLocal (``warmup.demonstrator=first_of_kind``): its error rate over 1000 tasks,
the error it makes, and filtered BC (``warmup.keep=success``) keeping exactly its successful episodes."""

from __future__ import annotations

import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.run.warmup import build_demonstrations, demonstrator_policy, play_episode
from openmanus_rl_env_babyai import BabyAIEnv

GOTO = {"levels": ["BabyAI-GoToLocal-v0"], "show_actions": False}
TURNS = 3  # the babyai_goto preset's env.max_turns


def test_first_of_kind_fails_on_half_the_tasks_by_ignoring_colour():
    env = BabyAIEnv(**GOTO)
    ours, oracle, wrong_colour = [], [], 0
    for t in range(1000):  # the preset's first 1000 training tasks: its warm-up's demonstrations
        _, steps, reward, success = play_episode(env, {"task_id": t}, TURNS, demonstrator_policy(env, "first_of_kind"))
        ours.append(success)
        assert (reward > 0) == success  # the reward is kept with the episode
        if not success:
            kind, colour = env.mission.split()[-1], env.mission.split()[-2]
            went = [a.split() for a, _ in steps if a.startswith("go to ")]
            wrong_colour += any(w[-2] == kind and w[-3] != colour for w in went)
        oracle.append(play_episode(env, {"task_id": t}, TURNS, demonstrator_policy(env, "oracle"))[3])
    assert sum(ours) == 469  # error rate 0.531 over the 1000 tasks
    assert sum(oracle) == 973  # the oracle on the same tasks: 0.027
    assert wrong_colour >= 0.9 * (1000 - sum(ours))  # its failures go to an object of the kind in another colour


def test_an_unknown_demonstrator_is_one_line_naming_what_the_env_offers():
    with pytest.raises(ConfigError, match=r"warmup.demonstrator=nope: the env BabyAIEnv offers oracle, first_of_kind"):
        demonstrator_policy(BabyAIEnv(**GOTO), "nope")


def test_filtered_bc_keeps_exactly_the_successful_episodes():
    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.rollout import tokenizer_corpus

    def factory():
        return BabyAIEnv(**GOTO)

    template = build("template", {"name": "react", "kwargs": {}})
    tasks = [{"task_id": t, "seed": 0} for t in range(40)]
    tok = build_tokenizer(tokenizer_corpus(factory, template, tasks[:10], max_turns=TURNS), vocab_size=400)
    played_all: list[dict] = []
    every = build_demonstrations(factory, template, tok, tasks, TURNS, demonstrator="first_of_kind", keep="all",
                                 played=played_all)
    played: list[dict] = []
    kept = build_demonstrations(factory, template, tok, tasks, TURNS, demonstrator="first_of_kind", keep="success",
                                played=played)
    successes = [i for i, p in enumerate(played_all) if p["success"]]
    assert len(every) == 40 and 5 < len(successes) < 35  # both kinds are there
    assert [p["success"] for p in played] == [p["success"] for p in played_all]  # the same episodes, replayed
    assert [p["kept"] for p in played] == [p["success"] for p in played]
    assert kept == [every[i] for i in successes]  # exactly the successful episodes, token for token
    for p in played_all:
        assert (p["reward"] > 0) == p["success"]
