"""Benchmark arithmetic: how much lockstep loses to the env's tail, by how the `latency` env draws its delays.

    python bench/latency_model.py [--draws 4000] [--turns 3,4] [--seed 0]

No model and no env: lognormal delays only, with the ``latency`` env's own median and sigma, for the tasks and
samples per step that ``bench/async.py`` plays (16 x 8 = 128 episodes) on 2 ranks (its 2-core machine), every
episode ``--turns`` turns. Per step:

- lockstep env phase: each rank's turns each wait for the rank's slowest call; the step waits for the slower rank;
- slowest episode: the largest sum of one episode's delays, the least a step of episodes on their own can take.

Two ways of drawing the delays:

- ``shared``: every sample of a task waits the same times (one delay sequence per episode start; in the
  ``latency`` env, samples that act alike do);
- ``independent``: every call draws its own delay (the ``latency`` env once a group's samples act differently).

The table gives the median over ``--draws`` steps of each, and the median ratio: the most episodes on their own
could gain on the env phase alone, with generation and the update free.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import random
import statistics
from pathlib import Path

from openmanus_rl_env_latency import LatencyEnv


def _async_settings() -> dict[str, str]:
    """bench/async.py's common overrides, as ``{key: value}``."""
    spec = importlib.util.spec_from_file_location("bench_async", Path(__file__).with_name("async.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(o.split("=", 1) for o in module.COMMON)


_DEFAULTS = inspect.signature(LatencyEnv).parameters
MEDIAN_S = _DEFAULTS["median_ms"].default / 1000.0
SIGMA = _DEFAULTS["sigma"].default
_BENCH = _async_settings()
TASKS = int(_BENCH["data.train_batch_size"])
SAMPLES = int(_BENCH["rollout.n"])
RANKS = 2


def one_step(rng: random.Random, turns: int, shared: bool) -> tuple[float, float]:
    """(lockstep env phase, slowest episode's env time) of one step, in seconds."""
    def delays() -> list[float]:
        return [MEDIAN_S * math.exp(SIGMA * rng.gauss(0.0, 1.0)) for _ in range(turns)]

    if shared:
        episodes = [d for d in (delays() for _ in range(TASKS)) for _ in range(SAMPLES)]
    else:
        episodes = [delays() for _ in range(TASKS * SAMPLES)]
    per_rank = len(episodes) // RANKS
    ranks = [episodes[r * per_rank:(r + 1) * per_rank] for r in range(RANKS)]
    lockstep = max(sum(max(ep[t] for ep in rank) for t in range(turns)) for rank in ranks)
    slowest = max(sum(ep) for ep in episodes)
    return lockstep, slowest


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=4000)
    p.add_argument("--turns", default="3,4")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"{TASKS} tasks x {SAMPLES} samples on {RANKS} ranks, lognormal delays (median {MEDIAN_S * 1000:.0f} ms, "
          f"sigma {SIGMA}), median of {args.draws} steps\n")
    print("| delays | turns | lockstep env phase s | slowest episode s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for shared in (True, False):
        for turns in (int(t) for t in args.turns.split(",")):
            steps = [one_step(rng, turns, shared) for _ in range(args.draws)]
            print(f"| {'shared per task' if shared else 'independent'} | {turns} "
                  f"| {statistics.median(s[0] for s in steps):.2f} | {statistics.median(s[1] for s in steps):.2f} "
                  f"| {statistics.median(s[0] / s[1] for s in steps):.2f} |")


if __name__ == "__main__":
    main()
