"""``memory=summary``: the rule-written summary against a model-written one, wall time of a relay rollout.

    python bench/summary_memory.py [--turns 60] [--episodes 4] [--window 4] [--budget 64] [--repeats 3]

The env is the built-in ``relay`` (``--turns`` stations); the model is a randomly initialised tiny Qwen2 with a
tokenizer trained on relay episodes (the same as bench/memory.py), on the HF engine, one torch thread. Writers:

- ``rule``: the default, no model call;
- ``policy``: the policy (the rollout's own engine) writes the summary, at most ``--budget`` tokens, one batched
  generate per turn over the live episodes;
- ``engine``: a separately configured ``openai`` engine writes it; here a fake server on a thread that answers at
  once (tests/fake_openai.py), so the row shows the request overhead, not a served model's speed.

After one untimed warm-up rollout, each writer runs the same episodes (same seed) ``--repeats`` times; the table gives the median wall time, the
turns, the generate calls of the replies and of the summaries, and the summaries' token lengths.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from openmanus_rl_core.engines.hf import HFEngine  # noqa: E402
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer  # noqa: E402
from openmanus_rl_core.plugin.registry import build  # noqa: E402
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks, tokenizer_corpus  # noqa: E402


def parts(args):
    from openmanus_rl_env_text.relay import RelayEnv

    template = build("template", {"name": "react", "kwargs": {}})
    env_factory = lambda: RelayEnv(length=args.turns, padding=3, num_tasks=1000)  # noqa: E731
    tok = build_tokenizer(tokenizer_corpus(env_factory, template, [{"task_id": i, "seed": 0} for i in range(4)]),
                          vocab_size=512)
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                             max_position_embeddings=4096, seed=0)
    return template, env_factory, tok, model


def once(writer: str, args, template, env_factory, tok, model, url: str | None) -> dict:
    kwargs = {"window": args.window, "max_chars": 600, "writer": writer}
    if writer != "rule":
        kwargs["max_summary_tokens"] = args.budget
    if writer == "engine":
        kwargs["engine"] = {"name": "openai", "kwargs": {"base_url": url, "model": "served"}}
    memory = build("memory", {"name": "summary", "kwargs": kwargs})
    cfg = RolloutConfig(max_turns=args.turns, max_new_tokens=args.max_new_tokens, max_sample_tokens=1024)
    loop = AgentLoop(HFEngine(model, tok, seed=0), tok, template, env_factory, cfg, memory=memory)
    t0 = time.perf_counter()
    episodes = loop.run(expand_tasks([{"task_id": 7, "seed": 0}], args.episodes))
    wall = time.perf_counter() - t0
    written = [n for e in episodes for n in e.trajectory.info.get("summary_tokens", [])]
    return {"wall": wall, "turns": sum(e.trajectory.num_turns for e in episodes) / len(episodes),
            "reply_calls": loop.stats["generate_calls"], "summary_calls": loop.summaries.calls if loop.summaries else 0,
            "summaries": len(written), "max_tokens": max(written, default=0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fake_openai import FakeOpenAI

    template, env_factory, tok, model = parts(args)
    rows = []
    once("rule", args, template, env_factory, tok, model, None)  # warm-up, not timed
    with FakeOpenAI(lambda body: "The runner passed every station so far, saying each word.") as server:
        for writer in ("rule", "policy", "engine"):
            runs = [once(writer, args, template, env_factory, tok, model, server.url) for _ in range(args.repeats)]
            walls = [r["wall"] for r in runs]
            rows.append((writer, statistics.median(walls), min(walls), max(walls), runs[0]))
    print(f"relay, {args.turns} turns, {args.episodes} episodes, window {args.window}, summary budget {args.budget} "
          f"tokens, max_new_tokens {args.max_new_tokens}, median of {args.repeats}, 1 torch thread")
    print("| writer | rollout s (median) | min-max | turns/episode | reply generate calls | summary generate calls "
          "| summaries | longest summary (tokens) |")
    print("|---|---|---|---|---|---|---|---|")
    base = rows[0][1]
    for writer, med, lo, hi, r in rows:
        print(f"| {writer} | {med:.2f} ({med / base:.2f}x) | {lo:.2f}-{hi:.2f} | {r['turns']:.1f} | {r['reply_calls']} "
              f"| {r['summary_calls']} | {r['summaries']} | {r['max_tokens']} |")


if __name__ == "__main__":
    main()
