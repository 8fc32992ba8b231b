"""The ``openenv`` env plugin's cost per env step, over the same OpenEnv env called in process.

    python bench/openenv.py                      # 64 episodes at once, 20 rounds of reset + 3 steps each
    python bench/openenv.py --episodes 64 --rounds 20 --runs 3

The env is the plugin tests' Words env (``plugins/envs/openenv/tests/openenv_words``: openenv-core's ``Environment``
and ``create_app``), whose own step takes microseconds, so what is measured is the plugin's path: the reply turned
into the Action, the WebSocket message to the env's uvicorn server (started by the plugin's ``serve()`` on
loopback, one server holding every session) and back, the observation turned into text.

Both sides play the same lockstep turns: ``--episodes`` episodes at once (one thread each, as the rollout's env
pool runs them), every turn one ``step`` per episode, each thread's call timed. In process, each thread calls its
own ``WordsEnvironment`` (``env.step(WordAction(word=...))``); through the plugin, its own ``OpenEnvEnv``. A turn's
overhead per step is (the plugin's turn wall time - the in-process turn's) / episodes: what each step adds to the
rollout. Printed: that overhead's p50 and p99 over the turns, each call's latency p50 / p99 on both sides, and the
1-minute load average before and after. ``--runs`` repeats the measurement (one server start) and prints each run
and the median of the runs' p50 and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = REPO / "plugins" / "envs" / "openenv" / "tests" / "openenv_words"
# This file is named openenv.py: its folder must not shadow the openenv package (openenv-core) on the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(WORDS))

from openmanus_rl_env_openenv import OpenEnvEnv  # noqa: E402


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def lockstep(envs: list, reset, step, rounds: int, steps: int) -> tuple[list[float], list[float]]:
    """Turn wall times and per-call latencies: ``rounds`` x (reset every env, then ``steps`` lockstep turns)."""
    n = len(envs)
    barrier = threading.Barrier(n + 1)
    calls: list[list[float]] = [[] for _ in range(n)]
    stop = threading.Event()

    def worker(i: int) -> None:
        for r in range(rounds):
            barrier.wait()
            reset(envs[i], r * n + i)
            barrier.wait()
            for _ in range(steps):
                barrier.wait()
                t0 = time.perf_counter()
                step(envs[i])
                calls[i].append(time.perf_counter() - t0)
                barrier.wait()
            if stop.is_set():
                return

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    turns = []
    for _ in range(rounds):
        barrier.wait()  # resets start
        barrier.wait()  # resets done
        for _ in range(steps):
            barrier.wait()
            t0 = time.perf_counter()
            barrier.wait()
            turns.append(time.perf_counter() - t0)
    for t in threads:
        t.join()
    return turns, [x for c in calls for x in c]


def in_process(episodes: int, rounds: int, steps: int) -> tuple[list[float], list[float]]:
    from omrl_words_env.models import WordAction
    from omrl_words_env.server.environment import WordsEnvironment

    envs = [WordsEnvironment() for _ in range(episodes)]
    return lockstep(envs, lambda e, t: e.reset(seed=t), lambda e: e.step(WordAction(word="wrong")), rounds, steps)


def through_plugin(kwargs: dict, episodes: int, rounds: int, steps: int) -> tuple[list[float], list[float]]:
    envs = [OpenEnvEnv(**kwargs) for _ in range(episodes)]
    envs[0].instruction  # the /schema fetch, once per process, before timing
    try:
        return lockstep(envs, lambda e, t: e.reset(task_id=t), lambda e: e.step("wrong"), rounds, steps)
    finally:
        for e in envs:
            e.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=3, help="steps per episode (the Words env allows 3 misses)")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    service = OpenEnvEnv.serve(app="omrl_words_env.server.app:app", sessions=a.episodes, max_servers=1,
                               server_env={"WORDS_SESSIONS": a.episodes, "PYTHONPATH": str(WORDS)},
                               timeout_s=30.0, health_timeout_s=120.0)
    runs = []
    try:
        through_plugin(service.kwargs, a.episodes, 2, a.steps)  # warm: connections, imports, the server's caches
        for _ in range(a.runs):
            base_turns, base_calls = in_process(a.episodes, a.rounds, a.steps)
            turns, calls = through_plugin(service.kwargs, a.episodes, a.rounds, a.steps)
            over = [(t - b) / a.episodes * 1e3 for t, b in zip(turns, base_turns)]
            runs.append({
                "overhead_per_step_ms": {"p50": quantile(over, 0.5), "p99": quantile(over, 0.99)},
                "turn_ms": {"plugin_p50": quantile(turns, 0.5) * 1e3,
                            "in_process_p50": quantile(base_turns, 0.5) * 1e3},
                "call_latency_ms": {"plugin_p50": quantile(calls, 0.5) * 1e3, "plugin_p99": quantile(calls, 0.99) * 1e3,
                                    "in_process_p50": quantile(base_calls, 0.5) * 1e3,
                                    "in_process_p99": quantile(base_calls, 0.99) * 1e3},
                "turns": len(turns)})
    finally:
        service.close()
    load1 = os.getloadavg()[0]
    rnd = lambda d: {k: (rnd(v) if isinstance(v, dict) else round(v, 3)) for k, v in d.items()}  # noqa: E731
    for i, r in enumerate(runs):
        print(f"run {i + 1}: " + json.dumps(rnd(r)))
    p50 = statistics.median(r["overhead_per_step_ms"]["p50"] for r in runs)
    p99 = statistics.median(r["overhead_per_step_ms"]["p99"] for r in runs)
    print(json.dumps({"episodes": a.episodes, "steps_per_turn": a.episodes, "runs": len(runs),
                      "overhead_per_step_ms_p50": round(p50, 3), "overhead_per_step_ms_p99": round(p99, 3),
                      "load_1min_before": round(load0, 2), "load_1min_after": round(load1, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
