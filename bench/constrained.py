"""Cost of grammar-constrained decoding on the ``hf`` engine: a ``json_schema`` reply against an unconstrained reply
of the same length (engines/constrained.py).

    python bench/constrained.py [--repeats 3]

Two models: the embedded default's size (hidden 128, 2 layers, 1,024-token BPE) and a 31M one (hidden 512, 8 layers,
8 heads, 2 key/value heads, MLP 2048), randomly initialised, one torch thread. Each side runs in a fresh process,
``--repeats`` times, alternating; the table gives medians.

- ``json_schema``: 8 prompts, one ``generate`` each (one agent's request at a time), under a schema of bounded
  fields; the reply ends where the grammar ends (EOS). Its token counts are then given to
- ``free``: the same prompts, unconstrained, each cut to the same number of tokens (EOS ignored), so both sides
  decode exactly as many tokens.
- ``batch of 8``: the same 8 prompts in one call, each free reply ended at its constrained twin's length (so rows
  leave the batch at the same steps on both sides).

Where the grammar forces text (a key and its quotes, the closing brace), the json_schema side appends those tokens
at once and feeds them in one pass with the sampled token (engines/constrained.py, "Forced text"): the ``passes``
column counts the decoding passes of one-at-a-time replies on each side.

The grammar is compiled once per process before the timed part (the gateway compiles a schema once, on the first
request that brings it); that compile time is its own column. Both sides are timed on a second pass over the
prompts, after an untimed first one: llguidance builds its lexer's states as it first meets them, and a run decodes
under one schema again and again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SIZES = {
    "embedded default": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),
    "31M": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=2048),
}
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "alerts": {"type": "boolean"}},
    "required": ["city", "days", "unit", "alerts"], "additionalProperties": False}
WORDS = ("the a room key door box open take go north south east west apple pear note says you see there is "
         "weather city days unit celsius search query result action think observation answer").split()


def _corpus() -> list[str]:
    import random

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    texts += [json.dumps({"city": rng.choice(WORDS), "days": rng.randint(1, 14), "unit": "celsius",
                          "alerts": rng.random() < 0.5}) for _ in range(100)]
    return texts


def _engine(size: str):
    import torch

    from openmanus_rl_core.engines.hf import HFEngine
    from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer(_corpus(), vocab_size=1024)
    model = build_tiny_model(tok, seed=0, initializer_range=0.1, **SIZES[size])
    return HFEngine(model, tok, seed=0, num_threads=1), tok, sum(p.numel() for p in model.parameters())


class EndAtLengths:
    """Stands in for the engine's EOS ids on the free side of the batch: answers "an EOS" for a row's token when
    the row has reached its length. The engine asks once per live row per step, in row order, and drops the rows
    that ended (``engines/hf.py``), which is what this follows."""

    def __init__(self, lengths: list[int]):
        self.left, self.at = list(lengths), 0

    def __contains__(self, token: int) -> bool:
        self.left[self.at] -= 1
        ended = self.left[self.at] == 0
        self.at += 1
        if self.at == len(self.left):
            self.left, self.at = [n for n in self.left if n], 0
        return ended


def one_side(size: str, side: str, lengths: dict) -> dict:
    """Seconds of this side's timed part, in this process; ``lengths``: the json_schema side's reply lengths
    (``single``: one at a time, ``batch``: in the batch), which the free side reproduces."""
    from openmanus_rl_core.engines.constrained import json_schema_constraint
    from openmanus_rl_core.protocols import SamplingParams

    engine, tok, n_params = _engine(size)
    passes = [0]
    step = engine.fast.step

    def counted(*a, **k):
        passes[0] += 1
        return step(*a, **k)

    engine.fast.step = counted
    prompts = [tok.encode(f"the weather in city {i}, as json:", add_special_tokens=False) for i in range(8)]
    constraint = json_schema_constraint(SCHEMA)
    out: dict = {"params": n_params}
    if side == "json_schema":
        t0 = time.perf_counter()
        engine.grammars.matcher(constraint, engine.model.get_output_embeddings().weight.shape[0])
        out["compile_s"] = time.perf_counter() - t0
        # untimed: a first pass over the prompts (llguidance builds its lexer's states as it first meets them, and a
        # run uses one schema again and again; the free side makes the same pass)
        for p in prompts:
            engine.generate([p], SamplingParams(max_new_tokens=256, constraint=constraint))
        t0 = time.perf_counter()
        passes[0] = 0
        gens = [engine.generate([p], SamplingParams(max_new_tokens=256, constraint=constraint))[0] for p in prompts]
        out["single_s"] = time.perf_counter() - t0
        out["passes"] = passes[0]
        assert all(g.finish_reason == "stop" for g in gens), [g.text for g in gens]
        out["lengths"] = [len(g.token_ids) for g in gens]
        t0 = time.perf_counter()
        batch = engine.generate(prompts, SamplingParams(max_new_tokens=256, constraint=constraint))
        out["batch_s"] = time.perf_counter() - t0
        assert all(g.finish_reason == "stop" for g in batch), [g.text for g in batch]
        out["batch_lengths"] = [len(g.token_ids) for g in batch]
        out["batch_tokens"] = sum(out["batch_lengths"])
    else:
        engine.eos_token_ids = set()  # every reply runs to its given length
        for p, n in zip(prompts, lengths["single"]):  # the same untimed first pass
            engine.generate([p], SamplingParams(max_new_tokens=n))
        t0 = time.perf_counter()
        single = lengths["single"]
        passes[0] = 0
        gens = [engine.generate([p], SamplingParams(max_new_tokens=n))[0] for p, n in zip(prompts, single)]
        out["single_s"] = time.perf_counter() - t0
        out["passes"] = passes[0]
        assert [len(g.token_ids) for g in gens] == single
        engine.eos_token_ids = EndAtLengths(lengths["batch"])
        t0 = time.perf_counter()
        batch = engine.generate(prompts, SamplingParams(max_new_tokens=max(lengths["batch"])))
        out["batch_s"] = time.perf_counter() - t0
        out["batch_lengths"] = [len(g.token_ids) for g in batch]
        assert out["batch_lengths"] == lengths["batch"], out["batch_lengths"]
        out["batch_tokens"] = sum(out["batch_lengths"])
        out["lengths"] = single
    return out


def _run(size: str, side: str, lengths: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, __file__, "one-side", size, side, json.dumps(lengths)], check=True,
                         capture_output=True, text=True, env=env, cwd=ROOT)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    one = sub.add_parser("one-side")
    one.add_argument("size")
    one.add_argument("side")
    one.add_argument("lengths")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.cmd == "one-side":
        print(json.dumps(one_side(args.size, args.side, json.loads(args.lengths))))
        return
    rows = []
    for size in SIZES:
        runs: dict[str, list[dict]] = {"json_schema": [], "free": []}
        lengths: dict = {}
        for _ in range(args.repeats):
            c = _run(size, "json_schema", {})
            lengths = lengths or {"single": c["lengths"], "batch": c["batch_lengths"]}
            # same seed, same weights: the same replies every run
            assert {"single": c["lengths"], "batch": c["batch_lengths"]} == lengths
            runs["json_schema"].append(c)
            runs["free"].append(_run(size, "free", lengths))
            print(f"  {size}: json_schema {c['single_s']:.3f}s, free {runs['free'][-1]['single_s']:.3f}s "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
        med = {s: {k: statistics.median(r[k] for r in rs) for k in ("single_s", "batch_s")} for s, rs in runs.items()}
        rows.append((size, runs["json_schema"][0]["params"], sum(lengths["single"]), sum(lengths["batch"]), med,
                     statistics.median(r["compile_s"] for r in runs["json_schema"]),
                     (runs["json_schema"][0]["passes"], runs["free"][0]["passes"])))
    print(f"\nhf engine, one torch thread, median of {args.repeats} fresh processes per side, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| model | params | one at a time: tokens | passes (json_schema / free) | json_schema | free | ratio | "
          "batch of 8: tokens | json_schema | free | ratio | compile |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, n, single, batch, med, compile_s, passes in rows:
        c, f = med["json_schema"], med["free"]
        print(f"| {size} | {n / 1e6:.2f}M | {single} | {passes[0]} / {passes[1]} | {c['single_s']:.3f}s | "
              f"{f['single_s']:.3f}s | "
              f"{c['single_s'] / f['single_s']:.2f}x | {batch} | {c['batch_s']:.3f}s | {f['batch_s']:.3f}s | "
              f"{c['batch_s'] / f['batch_s']:.2f}x | {1000 * compile_s:.1f} ms |")

if __name__ == "__main__":
    main()
