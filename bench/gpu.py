"""Benchmark (CUDA GPU): training and generation throughput of a Qwen2-0.5B-shaped model.

    python bench/gpu.py [--batch 4] [--seq-len 2048] [--steps 10] [--warmup 3] [--activation-checkpointing] [--profile 25]
                        [--engines hf,vllm] [--gen-prompts 64] [--gen-prompt-len 256] [--gen-new-tokens 256]
                        [--gen-group 1] [--cudnn-attention]
                        [--gpu-memory-utilization 0.5] [--peak-tflops X] [--write]
    torchrun --nproc-per-node 8 bench/gpu.py ...      # FSDP2 over 8 GPUs (training part; generation on rank 0)

Exits with status 2 and a message when no CUDA GPU is visible. Nothing here has been run on a GPU by the project
yet (see bench/RESULTS.md); the numbers come from the first run with ``--write`` on a GPU machine.

Model: ``transformers.Qwen2ForCausalLM`` from ``Qwen2Config(hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936, tied embeddings)`` -- Qwen2-0.5B's shape -- randomly initialised (no download).

Training: the actor's code path (:func:`openmanus_rl_core.distributed.fsdp.apply_fsdp`: FSDP2 ``fully_shard`` per decoder
layer, then the root, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; fp32 master weights, AdamW),
NCCL process group, optional HF activation checkpointing. One step = forward + cross-entropy over ``--batch`` x
``--seq-len`` random tokens, backward, optimizer step. Timed over ``--steps`` steps after ``--warmup``, with
``torch.cuda.synchronize``. Reported:

- tokens/s = batch x seq_len x world_size / step time (and per GPU);
- MFU = 6 x N x tokens/s / (world_size x peak dense bf16 FLOP/s of the GPU), N = parameter count (tied embedding
  counted once: it is the lm_head matmul). The attention score FLOPs (12 x layers x hidden x seq per token) are left
  out, as in the usual "6N" model-FLOPs convention, so the figure is conservative; with activation checkpointing
  the GPU does ~8N of work per token but MFU still counts 6N (model FLOPs, not hardware FLOPs).

Generation (rank 0, after the training model and optimizer are freed): for each engine in ``--engines`` that can
be imported, ``--gen-prompts`` prompts of ``--gen-prompt-len`` random token ids, sampled at temperature 1 for
``--gen-new-tokens`` new tokens in ONE ``generate`` call (the rollout's call); tokens/s counts the tokens actually
generated (a reply may end early at EOS) over the wall time of that call, after one short warm-up call. ``hf`` is
:class:`~openmanus_rl_core.engines.hf.HFEngine` on a bf16 copy; ``vllm`` is
:class:`~openmanus_rl_core.engines.vllm.VLLMEngine` (bf16, ``--gpu-memory-utilization``), whose weights are pushed
in memory exactly as after a training step (its construction time and one ``update_weights`` are reported too).

Peak dense bf16 FLOP/s (NVIDIA data sheets, without sparsity): H100 SXM / H200 989 TFLOP/s, H100 PCIe 756,
H100 NVL 835, A100 312, L40S 362, L4 121, A10/A10G 125. ``--peak-tflops`` overrides the table for other GPUs.

Output: a markdown table (GPU name, world size, settings, each measurement) on stdout; ``--write`` appends it with
the date and the command line to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

# name fragment (lower case, checked in order) -> peak dense bf16 TFLOP/s
PEAK_BF16_TFLOPS = [
    ("h200", 989.0),
    ("h100 pcie", 756.0),
    ("h100 nvl", 835.0),
    ("h100", 989.0),  # SXM5 / HBM3
    ("gh200", 989.0),
    ("a100", 312.0),
    ("l40s", 362.0),
    ("l4", 121.0),
    ("a10", 125.0),
]

QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6)


def peak_tflops(gpu_name: str, override: float | None) -> float | None:
    if override:
        return float(override)
    name = gpu_name.lower()
    for frag, tflops in PEAK_BF16_TFLOPS:
        if frag in name:
            return tflops
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(seed: int = 0, shape: dict | None = None):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**(shape or QWEN2_05B), bos_token_id=0, eos_token_id=2, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model


def build_tokenizer():
    """A small byte-level BPE (ids 0..~500): generation only needs pad/EOS ids and ``decode`` (unknown ids are
    skipped), and the prompts are drawn from its id range."""
    from openmanus_rl_core.models.loading import build_tokenizer as _bt

    return _bt(["The quick brown fox jumps over the lazy dog. " * 4, "<action>look</action> Observation: ok"],
               vocab_size=512)


# ---------------------------------------------------------------------------------------------------- training
def bench_training(args, rank: int, world: int, device) -> dict:
    import torch
    import torch.distributed as dist

    from openmanus_rl_core.distributed.fsdp import apply_fsdp

    model = build_model(args.seed, args.shape)
    n_params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    if args.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model = apply_fsdp(model.to(device), "bf16")
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)
    B, S = args.batch, args.seq_len
    tokens = torch.randint(0, args.shape["vocab_size"], (B, S), device=device, generator=gen)

    def step() -> float:
        out = model(input_ids=tokens, labels=tokens)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    for _ in range(args.warmup):
        step()
    _sync(device)
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    loss = 0.0
    for _ in range(args.steps):
        loss = step()
    _sync(device)
    dist.barrier()
    dt = (time.perf_counter() - t0) / args.steps
    tokens_per_s = B * S * world / dt
    profile = _profile(step, device, args.profile) if args.profile else ""
    peak_mem = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
    del model, optim, tokens
    _free()
    return {"params": n_params, "step_s": dt, "tokens_per_s": tokens_per_s, "tokens_per_s_gpu": tokens_per_s / world,
            "peak_mem_gib": peak_mem, "loss": loss, "profile": profile}


def _profile(step, device, rows: int) -> str:
    """Two more training steps under ``torch.profiler``: the ``rows`` operators that took the most device time
    (CPU time on a CPU), as PyTorch's own table -- where a step's time goes beyond the matrix products."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            step()
        _sync(device)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


# -------------------------------------------------------------------------------------------------- generation
def _prompts(args, vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(args.seed)
    # ids 3.. of the small tokenizer: never a special token (0 pad, 1 <|im_start|>, 2 EOS)
    group = max(1, args.gen_group)  # a GRPO group's samples share their prompt
    distinct = torch.randint(3, vocab, (-(-args.gen_prompts // group), args.gen_prompt_len), generator=g).tolist()
    return [distinct[i // group] for i in range(args.gen_prompts)]


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _time_generate(engine, prompts, args, device) -> tuple[float, int]:
    from openmanus_rl_core.protocols import SamplingParams

    engine.generate(prompts[: min(4, len(prompts))], SamplingParams(max_new_tokens=8, temperature=1.0))  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=args.gen_new_tokens, temperature=1.0))
    _sync(device)
    dt = time.perf_counter() - t0
    return dt, sum(len(g.token_ids) for g in gens)


def bench_hf(args, device, share_prompts: bool = True) -> dict:
    import torch

    from openmanus_rl_core.engines.hf import HFEngine

    tok = build_tokenizer()
    model = build_model(args.seed, args.shape).to(getattr(torch, args.gen_dtype))
    engine = HFEngine(model, tok, device=device, seed=args.seed, share_prompts=share_prompts)
    if args.cudnn_attention:  # the engine turned it off (models.avoid_cudnn_attention): back on, to compare
        torch.backends.cuda.enable_cudnn_sdp(True)
    dt, n = _time_generate(engine, _prompts(args, len(tok)), args, device)
    del engine, model
    _free()
    name = "hf" if args.gen_group == 1 else f"hf, share_prompts={share_prompts}"
    return {"engine": name, "gen_s": dt, "tokens": n, "tokens_per_s": n / dt}


def bench_vllm(args, device) -> dict:
    import torch

    from openmanus_rl_core.engines.vllm import VLLMEngine

    tok = build_tokenizer()
    model = build_model(args.seed, args.shape).to(getattr(torch, args.gen_dtype))
    t0 = time.perf_counter()
    engine = VLLMEngine(model=model, tokenizer=tok, dtype=args.gen_dtype, seed=args.seed,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        max_model_len=args.gen_prompt_len + args.gen_new_tokens + 8, **args.vllm_kwargs)
    build_s = time.perf_counter() - t0
    sd = model.state_dict()  # what the actor pushes after each step (here: the same weights again)
    t0 = time.perf_counter()
    engine.update_weights(sd)
    _sync(device)
    update_s = time.perf_counter() - t0
    del model, sd
    dt, n = _time_generate(engine, _prompts(args, len(tok)), args, device)
    engine.close()
    return {"engine": "vllm", "gen_s": dt, "tokens": n, "tokens_per_s": n / dt, "build_s": build_s,
            "update_weights_s": update_s}


# ------------------------------------------------------------------------------------------------------ report
def table(args, gpu: str, world: int, train: dict | None, gens: list[dict], skipped: list[str]) -> str:
    import torch

    peak = peak_tflops(gpu, args.peak_tflops)
    lines = [f"### {gpu} x {world} -- {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}", "",
             f"`python bench/gpu.py {' '.join(sys.argv[1:])}` (torch {torch.__version__}, CUDA {torch.version.cuda})",
             "", "| measurement | value |", "|---|---|"]
    if train:
        mfu = (6 * train["params"] * train["tokens_per_s"] / (world * peak * 1e12)) if peak else None
        lines += [
            f"| model | {'tiny smoke shape' if args.smoke else 'Qwen2-0.5B shape'}, random init, "
            f"{train['params'] / 1e6:.1f}M parameters |",
            f"| training step (FSDP2, bf16 params / fp32 reduce, AdamW{', activation checkpointing' if args.activation_checkpointing else ''}) | "
            f"{args.batch} x {args.seq_len} tokens per GPU: {train['step_s'] * 1000:.0f} ms |",
            f"| training tokens/s | {train['tokens_per_s']:,.0f} ({train['tokens_per_s_gpu']:,.0f} per GPU) |",
            f"| MFU (6N x tokens/s / peak bf16) | "
            + (f"{100 * mfu:.1f}% of {peak:g} TFLOP/s per GPU |" if mfu is not None else
               "n/a (unknown GPU: pass --peak-tflops) |"),
            f"| peak memory (training, per GPU) | {train['peak_mem_gib']:.1f} GiB |",
        ]
    for g in gens:
        extra = ""
        if g["engine"] == "vllm":
            extra = (f"; start-up {g['build_s']:.1f} s, update_weights {g['update_weights_s'] * 1000:.0f} ms, "
                     f"gpu_memory_utilization {args.gpu_memory_utilization}")
        groups = f" in groups of {args.gen_group}" if args.gen_group > 1 else ""
        lines.append(f"| generation tokens/s, {g['engine']} | {g['tokens_per_s']:,.0f} ({args.gen_prompts} prompts x "
                     f"{args.gen_prompt_len} tokens{groups}, up to {args.gen_new_tokens} new, T=1; {g['tokens']} "
                     f"tokens in {g['gen_s']:.2f} s{extra}) |")
    for s in skipped:
        lines.append(f"| generation, {s} | not available here |")
    if train and train["profile"]:
        lines += ["", "Two training steps under torch.profiler (`--profile`), by self device time:", "", "```",
                  train["profile"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4, help="sequences per GPU per training step")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="after the timed steps, profile two more and print the ROWS costliest operators")
    p.add_argument("--engines", default="hf,vllm", help="comma-separated rollout engines to time ('' for none)")
    p.add_argument("--gen-prompts", type=int, default=64)
    p.add_argument("--gen-prompt-len", type=int, default=256)
    p.add_argument("--gen-new-tokens", type=int, default=256)
    p.add_argument("--gen-group", type=int, default=1, help="prompts in groups of this many identical ones (a GRPO "
                                                            "group); above 1, hf runs with and without its shared "
                                                            "prefill")
    p.add_argument("--cudnn-attention", action="store_true",
                   help="hf: keep PyTorch's cuDNN attention on (the engine turns it off on CUDA), to compare")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s of one GPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    p.add_argument("--smoke", action="store_true",
                   help="check this script's code paths on a CPU: a tiny model, gloo, float32, a few tokens "
                        "(the numbers mean nothing; never written to RESULTS.md)")
    args = p.parse_args(argv)
    args.shape = dict(QWEN2_05B)
    args.gen_dtype = "bfloat16"
    args.vllm_kwargs = {}

    import torch

    if args.smoke:
        args.shape.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          intermediate_size=128, vocab_size=512, max_position_embeddings=512)
        args.batch, args.seq_len, args.steps, args.warmup = 2, 32, 2, 1
        args.gen_prompts, args.gen_prompt_len, args.gen_new_tokens = 4, 8, 8
        args.gen_dtype, args.write = "float32", False
        args.vllm_kwargs = {"enforce_eager": True}
    elif not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU and sees none (torch.cuda.is_available() is False: torch "
              f"{torch.__version__}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Run it on a "
              "GPU machine with a CUDA build of torch; see docs/gpu-and-clusters.md. (--smoke checks the script's "
              "code paths on a CPU.)", file=sys.stderr)
        return 2
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.smoke:
        device, backend, gpu = torch.device("cpu"), "gloo", "CPU (smoke run)"
    else:
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
        gpu = torch.cuda.get_device_name(device)
    train = None
    if not args.skip_training:
        if not dist.is_initialized():
            init = "env://" if "MASTER_ADDR" in os.environ else f"tcp://127.0.0.1:{_free_port()}"
            dist.init_process_group(backend, rank=rank, world_size=world, init_method=init)
        train = bench_training(args, rank, world, device)
        dist.destroy_process_group()  # vLLM below starts its own (world size 1) group
    gens: list[dict] = []
    skipped: list[str] = []
    if rank == 0:
        for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
            try:
                if name == "hf" and args.gen_group > 1:  # the engine's shared prefill against none
                    gens += [bench_hf(args, device, share) for share in (True, False, True, False)]
                elif name == "hf":
                    gens.append(bench_hf(args, device))
                elif name == "vllm":
                    try:
                        import vllm  # noqa: F401
                    except ImportError:
                        skipped.append("vllm (not installed: `pip install 'openmanus-rl-core[vllm]'`)")
                        continue
                    gens.append(bench_vllm(args, device))
                else:
                    skipped.append(f"{name} (unknown engine name: hf, vllm)")
            except torch.cuda.OutOfMemoryError as exc:
                skipped.append(f"{name} (out of GPU memory: {str(exc).splitlines()[0]})")
        report = table(args, gpu, world, train, gens, skipped)
        print(report)
        if args.write:
            with open(HERE / "RESULTS.md", "a") as f:
                f.write("\n" + report)
            print(f"appended to {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
