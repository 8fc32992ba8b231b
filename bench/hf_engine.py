"""Benchmark: the HF engine's multi-turn generation with and without its prefix cache and fused decoding step.

    python bench/hf_engine.py [--model DIR] [--batches 2,8,64] [--turns 4] [--repeats 3]

Each run plays ``--turns`` turns of B episodes through one ``HFEngine``, one torch thread: a 62-token prompt per
episode (groups of 8 share one, as GRPO's samples do), 24 new tokens per reply (no stop), then a 20-token
observation appended, so each turn's prompt is the last one, its reply and the observation. Tokens are drawn from
a seeded generator, so every setting does the same work. Settings (``rollout.engine_kwargs``):

- ``whole``: ``prefix_cache_mb=0 fast_decode=false``, every turn prefills its whole prompt, and every decoding step
  is the model's forward;
- ``prefix cache``: ``fast_decode=false``, turns after the first prefill only what follows the last turn;
- ``fast decode``: ``prefix_cache_mb=0``, decoding steps in plain torch calls (Llama-family models);
- ``both``: the defaults.

Each run is a fresh process; rows are interleaved over the repeats, and the table gives the median seconds of all
the turns' ``generate`` calls. ``--model``: a Hugging Face folder (default: the embedded default's tiny model,
built from its config with a tokenizer trained on a small corpus). The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {
    "whole": {"prefix_cache_mb": 0, "fast_decode": False},
    "prefix cache": {"fast_decode": False},
    "fast decode": {"prefix_cache_mb": 0},
    "both": {},
}


def one_run(model_dir: str, batch: int, turns: int, kwargs: dict) -> dict:
    """Runs in its own process: the seconds of each turn's generate call, and the prefix cache's hit share."""
    import torch

    from openmanus_rl_core.engines.hf import HFEngine
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.protocols import SamplingParams
    from openmanus_rl_core.config.schema import ModelConfig

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(ModelConfig(path=model_dir), [])
    engine = HFEngine(model, tok, seed=0, **kwargs)
    g = torch.Generator().manual_seed(0)
    vocab = len(tok)
    tasks = [torch.randint(5, vocab, (62,), generator=g).tolist() for _ in range(max(1, batch // 8))]
    prompts = [tasks[i % len(tasks)] for i in range(batch)]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=1.0, top_k=0)
    engine.eos_token_ids = set()  # every reply is 24 tokens: the same work in every setting
    seconds = []
    for _ in range(turns):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        seconds.append(time.perf_counter() - t0)
        prompts = [p + gen.token_ids + torch.randint(5, vocab, (20,), generator=g).tolist()
                   for p, gen in zip(prompts, gens)]
    pc = engine.prefix_cache
    return {"seconds": seconds, "hit_share": pc.hit_tokens / max(pc.prompt_tokens, 1) if pc is not None else 0.0,
            "fast": engine.fast is not None}


def tiny_model(folder: str) -> str:
    """The embedded default's model (its config, random weights) with a tokenizer trained on a small corpus."""
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.config.schema import ModelConfig

    corpus = [f"<action>go {d}</action> You see a door {i}." for i in range(200) for d in ("north", "south")]
    load_model_and_tokenizer(ModelConfig(), corpus, save_dir=folder)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--batches", default="2,8,64")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one run, as JSON
    args = p.parse_args()
    if args.one:
        spec = json.loads(args.one)
        print(json.dumps(one_run(spec["model"], spec["batch"], spec["turns"], spec["kwargs"])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or tiny_model(tmp)
        results: dict[tuple[int, str], list[dict]] = {}
        load = [os.getloadavg()[0]]
        for _ in range(args.repeats):
            for batch in [int(b) for b in args.batches.split(",")]:
                for name, kwargs in SETTINGS.items():
                    spec = json.dumps({"model": model, "batch": batch, "turns": args.turns, "kwargs": kwargs})
                    out = subprocess.run([sys.executable, __file__, "--one", spec], capture_output=True, text=True,
                                         check=True)
                    results.setdefault((batch, name), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
        load.append(os.getloadavg()[0])
    print(f"\n{args.turns} turns, median of {args.repeats} runs; load average {load[0]:.1f} -> {load[1]:.1f}\n")
    print("| episodes | setting | generate s, all turns | first turn | last turn | vs whole | prefix hit share |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for (batch, name), runs in results.items():
        total = statistics.median(sum(r["seconds"]) for r in runs)
        base = statistics.median(sum(r["seconds"]) for r in results[(batch, "whole")])
        first = statistics.median(r["seconds"][0] for r in runs)
        last = statistics.median(r["seconds"][-1] for r in runs)
        print(f"| {batch} | {name} | {total:.3f} | {first:.3f} | {last:.3f} | {base / total:.2f}x | "
              f"{statistics.median(r['hit_share'] for r in runs):.2f} |")


if __name__ == "__main__":
    main()
