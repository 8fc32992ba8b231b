"""The in-process benchmarks measured: first-observation size, oracle episode length and success on validation
tasks, and memory per env with 128 envs alive at once (the numbers of docs/benchmarks.md).

    .venv/bin/python bench/benchmarks.py [textcraft babyai sciworld] [--envs 128] [--tasks 20]

Tokens are counted with the embedded default's tokenizer kind (byte-level BPE, 1024 tokens) trained on the
benchmark's own first observations, so they say how long a prompt the tiny model sees; characters are given too.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import yaml

from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import registry


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def config(name: str) -> dict:
    import importlib

    hooks = importlib.import_module(f"openmanus_rl_env_{name}.hooks")
    return yaml.safe_load((Path(hooks.__file__).parent / "configs" / "env" / f"{name}.yaml").read_text())


def episodes(name: str, cfg: dict, n: int) -> dict:
    factory = lambda: registry("env").build(name, **cfg["kwargs"])  # noqa: E731
    firsts, turns, wins = [], [], 0
    t0 = time.perf_counter()
    for k in range(n):
        env = factory()
        try:
            firsts.append(env.reset(cfg["train_tasks"] + k, k))
            for turn in range(1, cfg["max_turns"] + 1):
                r = env.step(env.oracle_action())
                if r.done:
                    break
            turns.append(turn)
            wins += bool(r.info.get("success"))
        finally:
            env.close()
    tok = build_tokenizer(firsts, vocab_size=1024)
    lengths = [len(tok.encode(f, add_special_tokens=False)) for f in firsts]
    return {"tasks": n, "oracle_success": wins / n, "oracle_turns_median": statistics.median(turns),
            "oracle_turns_max": max(turns), "first_obs_tokens_median": statistics.median(lengths),
            "first_obs_tokens_max": max(lengths), "first_obs_chars_median": statistics.median(map(len, firsts)),
            "seconds": round(time.perf_counter() - t0, 1)}


def memory(name: str, cfg: dict, count: int) -> dict:
    gc.collect()
    before = rss_mb()
    envs = [registry("env").build(name, **cfg["kwargs"]) for _ in range(count)]
    for k, env in enumerate(envs):
        env.reset(cfg["train_tasks"] + k, k)
        env.step(env.oracle_action())
    out = {"envs": count, "python_mb_per_env": round((rss_mb() - before) / count, 2)}
    if name == "sciworld":
        from openmanus_rl_env_sciworld.jvm import POOL

        pids = POOL.pids()
        jvm = sum(rss_mb(p) for p in pids)
        out.update(jvms=len(pids), jvm_rss_mb=round(jvm), jvm_mb_per_env=round(jvm / count, 1))
    for env in envs:
        env.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=["textcraft", "babyai", "sciworld"])
    p.add_argument("--envs", type=int, default=128)
    p.add_argument("--tasks", type=int, default=20)
    a = p.parse_args()
    for name in a.names:
        cfg = config(name)
        print(name, "episodes", episodes(name, cfg, a.tasks), flush=True)
        print(name, "memory", memory(name, cfg, a.envs), flush=True)


if __name__ == "__main__":
    main()
