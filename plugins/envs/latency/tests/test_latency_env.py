"""The latency wrapper: the inner env's behaviour unchanged, seeded lognormal waits, a clear error for a bad inner."""

from __future__ import annotations

import math
import statistics
import time

import pytest

from openmanus_rl_core.protocols import OracleEnv
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_env


def _waits(env, task_id, seed, steps, actions=("look",)):
    env.reset(task_id, seed)
    out = []
    for i in range(steps):
        env.step(actions[i % len(actions)])
        out.append(env.last_wait_s)
    return out


def test_wraps_the_inner_env_by_name_and_keeps_its_behaviour():
    env = registry("env").build("latency", inner="key_door", median_ms=0.0)
    inner = registry("env").build("key_door")
    assert isinstance(env, OracleEnv)
    assert env.instruction == inner.instruction and env.num_tasks == inner.num_tasks
    assert env.reset(3, 0) == inner.reset(3, 0)
    for action in ("open box", "say nothing", env.oracle_action()):
        a, b = env.step(action), inner.step(action)
        assert (a.observation, a.reward, a.done) == (b.observation, b.reward, b.done)
    check_env(lambda: registry("env").build("latency", inner="key_door", median_ms=0.0))


def test_waits_are_seeded_per_call_and_lognormal(monkeypatch):
    env = registry("env").build("latency", inner="key_door", median_ms=0.5, sigma=1.2, seed=7)
    first = _waits(env, 5, 1, 4)
    assert len(set(first)) == 4  # each step of an episode draws its own wait
    assert _waits(env, 2, 0, 4) != first  # another episode, other waits
    assert _waits(env, 5, 1, 4) == first  # the same calls wait the same times, whatever ran before
    # Two samples of one task: alike while their actions are, independent from the first action that differs.
    other = _waits(env, 5, 1, 4, actions=("look", "look", "open box"))
    assert other[:2] == first[:2] and other[2] != first[2] and other[3] != first[3]
    other_seed = registry("env").build("latency", inner="key_door", median_ms=0.5, sigma=1.2, seed=8)
    assert _waits(other_seed, 5, 1, 4) != first
    # log(wait / median) ~ N(0, sigma) over calls: 2000 steps of different actions (sleeps skipped), the median
    # within 10% and the std of the log within 5%.
    monkeypatch.setattr(time, "sleep", lambda s: None)
    env.reset(9, 0)
    draws = []
    for i in range(2000):
        env.step(f"say {i}")
        draws.append(env.last_wait_s)
    logs = [math.log(d / 0.0005) for d in draws]
    assert abs(statistics.median(draws) / 0.0005 - 1) < 0.1
    assert abs(statistics.pstdev(logs) - 1.2) < 0.06


def test_a_step_really_sleeps():
    env = registry("env").build("latency", inner="key_door", median_ms=30.0, sigma=0.0)
    env.reset(0, 0)
    t0 = time.perf_counter()
    env.step("open box")
    assert 0.029 <= time.perf_counter() - t0 < 0.5
    assert env.waited_s == pytest.approx(0.030)


@pytest.mark.parametrize("kwargs, words", [({"inner": "latency"}, "not the wrapper itself"),
                                           ({"inner": "key_door", "median_ms": -1.0}, "median_ms=-1.0"),
                                           ({"inner": "no_such_env"}, "no_such_env")])
def test_bad_settings_name_the_value(kwargs, words):
    with pytest.raises(Exception, match=words):
        registry("env").build("latency", **kwargs)


def test_the_tokenizer_corpus_skips_the_simulated_waits_and_equals_the_inner_envs(tmp_path):
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.data.tasks import load_tasks
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.data.generation import ensure_task_files
    from openmanus_rl_core.run.warmup import build_corpus

    # The corpus the trainer builds for `train env=latency env.kwargs.median_ms=300` (run/model_folder.py): every
    # training task's oracle episode, each step 300 ms or more if played through the wrapper (~555 s in all).
    cfg = load(["env=latency", "env.kwargs.median_ms=300"])
    tasks = load_tasks(ensure_task_files(cfg, tmp_path)[0])[: cfg.model.corpus_tasks or None]
    assert len(tasks) == cfg.env.train_tasks == 240
    template = build("template", cfg.template)
    t0 = time.perf_counter()
    corpus = build_corpus(lambda: build("env", cfg.env), template, tasks, cfg.rollout.max_turns)
    assert time.perf_counter() - t0 < 10.0
    inner = lambda: registry("env").build(cfg.env.kwargs["inner"], **cfg.env.kwargs["inner_kwargs"])  # noqa: E731
    assert corpus == build_corpus(inner, template, tasks, cfg.rollout.max_turns)
    assert len(corpus) > 2 * len(tasks)  # the oracle's replies are in it, not only the prompts
