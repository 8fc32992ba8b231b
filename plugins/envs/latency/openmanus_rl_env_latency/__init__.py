"""``latency``: any env, by name, behind seeded lognormal step latency (docs/async.md).

Agent envs spend most of their time waiting (a server, a browser, a compiler) and their latency is heavy-tailed:
a few calls take many times the median. This wrapper makes any registered env behave so, reproducibly, to test
and measure how the rollout copes. Each ``step`` sleeps ``median_ms * exp(sigma * z)`` ms, ``z ~ N(0, 1)`` drawn
from a generator seeded by the call: ``seed``, the episode's start (``task_id`` and reset seed, or the start
observation) and every action so far, this one included. So the same call waits the same time in every run and
every rollout mode, and the samples of one task (a GRPO group starts them alike) wait independently once their
actions differ, as calls to a real server do. ``reset`` does not wait, and neither does work off the rollout path
(the tokenizer corpus, the warm-up's oracle episodes): ``without_delays()`` gives it the inner env.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from typing import Any, Mapping

from openmanus_rl_core.plugin.envs import EnvService, open_env_service
from openmanus_rl_core.protocols import StepResult
from openmanus_rl_core.plugin.registry import registry


class LatencyEnv:
    """``inner`` (an env plugin name) built with ``inner_kwargs``; every step waits a lognormal time.

    Everything else (``instruction``, ``num_tasks``, ``oracle_action``, ``reset_from_observation``, ...) is the
    inner env's.
    """

    def __init__(self, inner: str, inner_kwargs: Mapping[str, Any] | None = None, median_ms: float = 50.0,
                 sigma: float = 1.2, seed: int = 0):
        if inner == "latency":
            raise ValueError("env.kwargs.inner='latency': wrap another env, not the wrapper itself")
        if not median_ms >= 0 or not sigma >= 0:
            raise ValueError(f"env.kwargs.median_ms={median_ms!r} and sigma={sigma!r} must be >= 0")
        self.env = registry("env").build(inner, **dict(inner_kwargs or {}))
        self.median_s = float(median_ms) / 1000.0
        self.sigma = float(sigma)
        self.seed = int(seed)
        self.call = f"{self.seed}"  # the episode's start and its actions so far: what seeds the next wait
        self.rng = random.Random(self.call)
        self.waited_s = 0.0  # total sleep so far, and the last step's (tests and benchmarks read them)
        self.last_wait_s = 0.0

    @classmethod
    def serve(cls, inner: str, inner_kwargs: Mapping[str, Any] | None = None, at_once: int | None = None,
              **latency: Any) -> EnvService:
        """The inner env's servers (if it has any, sized for ``at_once`` episodes), with the latency settings kept."""
        service = open_env_service(inner, registry("env").get(inner), dict(inner_kwargs or {}), at_once=at_once)
        return EnvService(dict(latency, inner=inner, inner_kwargs=service.kwargs), service.stop, service.check)

    def delay_s(self) -> float:
        """A wait drawn from the current generator, in seconds (``step`` seeds it by the call first)."""
        return self.median_s * math.exp(self.sigma * self.rng.gauss(0.0, 1.0))

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        self.call = f"{self.seed}:{task_id}:{seed}"
        return self.env.reset(task_id=task_id, seed=seed)

    def reset_from_observation(self, observation: str) -> str:
        self.call = f"{self.seed}:{observation}"
        return self.env.reset_from_observation(observation)

    def step(self, action: str) -> StepResult:
        self.call = hashlib.sha256(f"{self.call}\n{action}".encode()).hexdigest()
        self.rng = random.Random(self.call)
        wait = self.delay_s()
        time.sleep(wait)
        self.waited_s += wait
        self.last_wait_s = wait
        return self.env.step(action)

    def without_delays(self) -> Any:
        """The inner env: the same episodes without the waits (the tokenizer corpus and the warm-up's oracle
        episodes play it; closing it closes this wrapper's env)."""
        return self.env

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not built yet (a failing constructor): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)
