"""Benchmark (CUDA GPU): the actor's own log-prob pass and update (ActorWorker: FSDP2, bf16) on one GPU, plain,
with shared prompts, and with shared prompts and packed rows.

    python bench/gpu_actor.py [--rows 64] [--group 8] [--prompt 512] [--response 256] [--steps 3]
                              [--max-tokens 16384] [--layers 24] [--smoke]

Exits with status 2 when no CUDA GPU is visible. Model: bench/gpu.py's Qwen2-0.5B shape (random init; ``--layers``
fewer for a quick look), saved once to a temporary folder with the small BPE tokenizer of bench/gpu.py; every
setting loads it into a fresh :class:`~openmanus_rl_core.workers.ActorWorker` (one rank, NCCL,
``trainer.mixed_precision=bf16``, ``actor.sharding=full``, the schema's other defaults, micro-batches of at most ``--max-tokens`` tokens).

Batch: ``--rows`` rows in GRPO groups of ``--group`` that share one prompt (each group's prompt length drawn from
[prompt/2, prompt]), each row with its own response of [response/4, response] positions holding a 4-token
observation span (attended, not trained); random advantages; on-policy (no old log-probs).

Per setting: the old-log-prob pass (``compute_log_probs``) and the update (``update``), each the median of
``--steps`` calls after one warm-up call, in ms, and the update's trained tokens per second; and the largest
difference of the setting's log-probs from the plain pass's, over the trained tokens (bf16 arithmetic, so not 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))

SETTINGS = {  # actor.<key> values of each row
    "plain": {"share_prompts": False},
    "shared prompts": {"share_prompts": True},
    "shared prompts + packed rows": {"share_prompts": True, "pack_rows": True},
}


def make_batch(rows: int, group: int, prompt: int, response: int, vocab: int, pad: int, seed: int = 0):
    import torch

    from openmanus_rl_core.batch import Batch

    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(prompt // 2, prompt + 1, (rows // group,), generator=g).repeat_interleave(group)
    rlen = torch.randint(max(1, response // 4), response + 1, (rows,), generator=g)
    P, R = int(plen.max()), int(rlen.max())
    ids = torch.full((rows, P + R), pad, dtype=torch.long)
    attn = torch.zeros((rows, P + R), dtype=torch.long)
    mask = torch.zeros((rows, R))
    for i, (p, r) in enumerate(zip(plen.tolist(), rlen.tolist())):
        if i % group == 0:
            head = torch.randint(3, vocab, (p,), generator=g)
        ids[i, P - p:P] = head
        ids[i, P:P + r] = torch.randint(3, vocab, (r,), generator=g)
        attn[i, P - p:P + r] = 1
        mask[i, :r] = 1
        if r > 8:
            mask[i, r // 2:r // 2 + 4] = 0
    batch = Batch(tensors={"input_ids": ids, "attention_mask": attn,
                           "position_ids": (attn.cumsum(-1) - 1).clamp_min(0), "responses": ids[:, P:].clone(),
                           "response_mask": mask})
    batch["advantages"] = torch.randn((rows, R), generator=g) * mask
    return batch


def timed(fn, steps: int) -> tuple[float, object]:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = fn()  # warm-up
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--smoke", action="store_true", help="check the script's code paths on a CPU (1 layer, few rows; "
                                                        "the numbers mean nothing)")
    args = p.parse_args()

    import torch

    device = "cuda"
    if args.smoke:
        device, args.rows, args.group, args.prompt, args.response, args.layers = "cpu", 8, 4, 32, 16, 1
    elif not torch.cuda.is_available():
        print("bench/gpu_actor.py needs a CUDA GPU (none is visible)", file=sys.stderr)
        return 2
    from bench.gpu import QWEN2_05B, build_model, build_tokenizer
    from openmanus_rl_core.config.schema import Config
    from openmanus_rl_core.distributed.ray_node import local_store_path
    from openmanus_rl_core.workers import ActorWorker

    shape = dict(QWEN2_05B, num_hidden_layers=args.layers)
    if args.smoke:
        shape.update(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128,
                     vocab_size=512)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        tok = build_tokenizer()
        build_model(0, shape).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        batch = make_batch(args.rows, args.group, args.prompt, args.response, len(tok), tok.pad_token_id)
        trained = float(batch["response_mask"].sum())
        results, plain = [], None
        for name, extra in SETTINGS.items():
            with socket.socket() as s:  # a fresh group per worker: a used rendezvous file would hang it
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            local_store_path(port).unlink(missing_ok=True)
            # The typed config built directly (the schema's defaults): no Hydra or plugin needed on a bare GPU box.
            cfg = Config()
            cfg.trainer = dataclasses.replace(cfg.trainer, device=device, mixed_precision="bf16")
            cfg.actor = dataclasses.replace(cfg.actor, sharding="full", lr=1e-7,
                                            max_tokens_per_micro_batch=args.max_tokens,
                                            log_prob_max_tokens_per_micro_batch=args.max_tokens, **extra)
            w = ActorWorker(cfg, rank=0, world_size=1, model_dir=str(model_dir), total_steps=100)
            w.setup("127.0.0.1", port)
            lp_s, lp = timed(lambda: w.compute_log_probs(batch, with_ref=False)["old_log_probs"], args.steps)
            up_s, metrics = timed(lambda: w.update(batch, step=1), args.steps)
            plain = lp if plain is None else plain
            m = batch["response_mask"].bool()
            gap = float((lp[m] - plain[m]).abs().max())
            results.append((name, lp_s, up_s, trained / up_s, gap, metrics["actor/loss"]))
            w.shutdown()
            if device == "cuda":
                torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (smoke run)"
    print(f"\n{gpu}, torch {torch.__version__}: {args.rows} rows in groups of {args.group}, prompts "
          f"{args.prompt // 2}-{args.prompt}, responses {max(1, args.response // 4)}-{args.response} "
          f"({int(trained)} trained tokens), {args.layers} layers, micro-batches <= {args.max_tokens} tokens\n")
    print("| setting | log-prob pass (ms) | update (ms) | update trained tokens/s | max log-prob gap vs plain | loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, lp_s, up_s, tps, gap, loss in results:
        print(f"| {name} | {lp_s * 1000:.0f} | {up_s * 1000:.0f} | {tps:,.0f} | {gap:.3g} | {loss:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
