"""Long episodes: the ``full`` memory (the whole episode in one sample) against ``window`` (task + last K turns, one
sample per turn) on a 50-turn env.

    python bench/memory.py [--turns 50] [--episodes 4] [--window 4] [--seeds 0 1 2] [--max-new-tokens 24]

The env is the built-in ``relay`` (``--turns`` stations, observations of ~80 tokens); the model is a randomly
initialised tiny Qwen2 (so episodes run to the turn limit) with a tokenizer trained on relay episodes. Per memory
and seed it reports, per episode:

- ``engine tokens``: prompt tokens the engine processed over the episode (the context fed to each generate call,
  summed over turns: the HF engine prefills the whole context every turn);
- ``train tokens``: tokens of the episode's training samples (prompt + response, no padding): what every forward
  and backward pass of the update processes;
- ``longest sample``: the longest training sample's tokens (what must fit the model's context and memory);
- wall seconds of the rollout, and of one forward + backward pass over the batch's samples (the update's cost).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from openmanus_rl_core.engines.hf import HFEngine  # noqa: E402
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer  # noqa: E402
from openmanus_rl_core.plugin.registry import build  # noqa: E402
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, build_batch, expand_tasks, tokenizer_corpus  # noqa: E402
from openmanus_rl_core.workers import sequence_logprobs  # noqa: E402


class CountingEngine(HFEngine):
    """The HF engine, counting the prompt tokens it is given."""

    prompt_tokens = 0

    def generate(self, prompts, params):
        self.prompt_tokens += sum(len(p) for p in prompts)
        return super().generate(prompts, params)


def run(memory_name: str, args, seed: int) -> dict:
    from openmanus_rl_env_text.relay import RelayEnv

    template = build("template", {"name": "react", "kwargs": {"think": True}})
    env_factory = lambda: RelayEnv(length=args.turns, padding=3, num_tasks=1000)  # noqa: E731
    tok = build_tokenizer(tokenizer_corpus(env_factory, template, [{"task_id": i, "seed": 0} for i in range(4)]),
                          vocab_size=512)
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                             max_position_embeddings=16384, seed=seed)
    kwargs = {"window": args.window} if memory_name == "window" else {}
    memory = build("memory", {"name": memory_name, "kwargs": kwargs})
    # The full memory gets room for the whole episode (else it is truncated and the comparison is void).
    cfg = RolloutConfig(max_turns=args.turns, max_new_tokens=args.max_new_tokens, max_sample_tokens=1024,
                        max_response_tokens=16384, max_prompt_tokens=1024)
    engine = CountingEngine(model, tok, seed=seed)
    loop = AgentLoop(engine, tok, template, env_factory, cfg, memory=memory)
    t0 = time.perf_counter()
    episodes = loop.run(expand_tasks([{"task_id": seed, "seed": seed}], args.episodes))
    rollout_s = time.perf_counter() - t0
    batch = build_batch(episodes, None, build("allocator", {"name": "last_token", "kwargs": {}}), tok.pad_token_id)
    model.train()
    t0 = time.perf_counter()
    for i in range(len(batch)):  # one sample at a time: the memory a micro-batch of one needs
        logp = sequence_logprobs(model, batch[i:i + 1], 1.0)[0]
        (logp * batch["response_mask"][i:i + 1]).sum().backward()
    train_s = time.perf_counter() - t0
    n = len(episodes)
    return {
        "turns": sum(e.trajectory.num_turns for e in episodes) / n,
        "truncated": sum(e.truncated for e in episodes),
        "samples": len(batch) / n,
        "engine_tokens": engine.prompt_tokens / n,
        "train_tokens": float(batch["attention_mask"].sum()) / n,
        "longest": int(batch["attention_mask"].sum(-1).max()),
        "rollout_s": rollout_s,
        "train_s": train_s,
    }


def span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}-{format(hi, fmt)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"relay, {args.turns} turns, {args.episodes} episodes per run, window={args.window}, max_new_tokens="
          f"{args.max_new_tokens}, seeds {args.seeds} (ranges over seeds)\n")
    print("| memory | turns/episode | truncated | samples/episode | engine tokens/episode | train tokens/episode "
          "| longest sample | rollout s | fwd+bwd s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("full", "window"):
        rows = [run(name, args, s) for s in args.seeds]
        col = lambda k, f: span([r[k] for r in rows], f)  # noqa: E731
        print(f"| {name} | {col('turns', '.1f')} | {col('truncated', 'd')} | {col('samples', '.0f')} | "
              f"{col('engine_tokens', '.0f')} | {col('train_tokens', '.0f')} | {col('longest', 'd')} | "
              f"{col('rollout_s', '.1f')} | {col('train_s', '.1f')} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
