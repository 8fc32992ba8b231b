"""The update on a batch of per-turn samples (``memory=window``): padding fraction and update time, rows padded to
the batch's longest in fixed row counts (before) against token-budget micro-batches of rows bucketed by length with
their all-padding columns cut (after).

    python bench/trainer.py --update-batches relay,babyai     (this section only; see bench/trainer.py)

Per env: the embedded default's tiny Qwen2 (random weights, so episodes run to the turn limit), ``--ub-episodes``
episodes of ``--ub-turns`` turns under the ``window`` memory, one training sample per turn, random advantages.
Both sides run the same on-policy update (one mini-batch, one optimizer step) on one in-process rank, one thread,
with the same peak tokens per forward pass: ``before`` splits rows in their order into ``--ub-rows`` rows padded to
the batch's longest row (the update as it was: no column is cut); ``after`` sets
``actor.max_tokens_per_micro_batch`` to ``--ub-rows`` x the longest row. Time: median of ``--ub-repeats`` updates
after one warm-up update. Padding fraction: padding positions over all positions the forward passes process.
``before`` and ``after`` run every row whole (``actor.share_prompts=false``); ``shared``: as ``after`` with shared
prompts (the default), so the start the rows' prompts have in common (system prompt, task) runs once per
micro-batch (openmanus_rl_core/models/shared_prompt.py). ``packed``: as ``after`` with ``actor.pack_rows=true`` (no padding
at all; attention over each packed micro-batch is one masked ``[T, T]`` product on CPU).

A second table times the HF engine's ``generate`` over the same rows' prompts: the shared starts prefilled once
(what the engine does) against every prompt prefilled whole.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch


ENV_OVERRIDES = {
    "relay": ["env=relay", "env.kwargs.length=50"],
    "babyai": ["env=babyai"],
}


def _padded_positions(batch, index) -> int:
    from openmanus_rl_core.workers.microbatch import row_extents

    prompt, resp = row_extents(batch)
    return int(sum(len(p) * (prompt[p].max() + max(1, resp[p].max())) for p in index))


def build_batch_for(env: str, args, work: Path):
    """A per-turn-sample batch of ``env`` and the model folder it was rolled out with."""
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.data.tasks import load_tasks
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.data.generation import ensure_task_files
    from openmanus_rl_core.rollout import build_batch, expand_tasks
    from openmanus_rl_core.run.warmup import build_corpus
    from openmanus_rl_core.workers import ActorWorker

    overrides = ENV_OVERRIDES[env] + ["memory=window", f"env.max_turns={args.ub_turns}", "trainer.device=cpu",
                                      "rollout.max_new_tokens=24", "seed=0"]
    cfg = load(overrides, training=False)
    train_file, _ = ensure_task_files(cfg, work / f"data-{env}")
    tasks = load_tasks(train_file)[: args.ub_episodes]
    template = build("template", cfg.template)
    corpus = build_corpus(lambda: build("env", cfg.env), template, load_tasks(train_file)[:8], 1)
    model_dir = work / f"model-{env}"
    load_model_and_tokenizer(cfg.model, corpus, save_dir=model_dir)
    w = ActorWorker(cfg, rank=0, world_size=1, model_dir=str(model_dir), total_steps=10)
    w.setup(*w.free_address())
    episodes = w.rollout(expand_tasks([dict(t, group_id=f"g{i}") for i, t in enumerate(tasks)], 1))
    alloc = lambda total, turns, segs, length: [0.0] * length  # noqa: E731
    batch = build_batch(episodes, None, alloc, w.tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(0)
    batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=g) * batch["response_mask"]
    keep = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages"]
    return batch.select(keep), overrides, str(model_dir)


def time_update(batch, overrides: list[str], model_dir: str, repeats: int, padded: bool) -> tuple[list[float], int]:
    """Update times (after one warm-up) of a fresh one-rank worker, and the positions its forward passes process."""
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.workers import ActorWorker, microbatch

    cfg = load(overrides, training=False)
    w = ActorWorker(cfg, rank=0, world_size=1, model_dir=model_dir, total_steps=repeats + 1)
    w.setup(*w.free_address())
    cut = microbatch.trim_columns
    if padded:  # the update as it was: rows padded to the batch's longest, no column cut
        microbatch.trim_columns = lambda b: (b, b["responses"].shape[1])
    try:
        index = w._micro_index(batch, cfg.actor.micro_batch_size, cfg.actor.max_tokens_per_micro_batch)
        positions = len(batch) * batch["input_ids"].shape[1] if padded else _padded_positions(batch, index)
        times = []
        for step in range(repeats + 1):
            t0 = time.perf_counter()
            w.update(batch, step=step + 1)
            times.append(time.perf_counter() - t0)
    finally:
        microbatch.trim_columns = cut
    return times[1:], positions


def time_generate(batch, model_dir: str, repeats: int) -> dict[str, list[float]]:
    """Seconds of one HF-engine ``generate`` (24 new tokens) over the batch's prompts, their shared starts run once
    (``shared``, what the engine does) or every prompt whole (``whole``, the prefix search switched off); the two
    sides alternate, ``repeats`` times each after one warm-up call of each."""
    from openmanus_rl_core.models import shared_prompt
    from openmanus_rl_core.engines.hf import HFEngine
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.protocols import SamplingParams
    from openmanus_rl_core.config.schema import ModelConfig

    model, tok = load_model_and_tokenizer(ModelConfig(path=model_dir), [])
    R = batch["responses"].shape[1]
    prompts = [ids[:-R][m[:-R].bool()].tolist() for ids, m in zip(batch["input_ids"], batch["attention_mask"])]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=1.0, top_k=0)
    search = shared_prompt.shared_prefixes
    times: dict[str, list[float]] = {"shared": [], "whole": []}
    try:
        for rep in range(repeats + 1):
            for side in times:
                shared_prompt.shared_prefixes = search if side == "shared" else (lambda rows: None)
                engine = HFEngine(model, tok, seed=rep)
                t0 = time.perf_counter()
                engine.generate(prompts, params)
                if rep:
                    times[side].append(time.perf_counter() - t0)
    finally:
        shared_prompt.shared_prefixes = search
    return times


def run(envs: list[str], args) -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-update-") as tmp:
        for env in envs:
            batch, overrides, model_dir = build_batch_for(env, args, Path(tmp))
            real = int(batch["attention_mask"].sum())
            longest = int(batch["attention_mask"].sum(-1).max())
            budget = f"actor.max_tokens_per_micro_batch={args.ub_rows * longest}"
            sides = {
                "before": (overrides + [f"actor.micro_batch_size={args.ub_rows}", "actor.sharding=full",
                                        "actor.share_prompts=false"], True),
                "after": (overrides + [budget, "actor.share_prompts=false"], False),
                "shared": (overrides + [budget], False),
                "packed": (overrides + [budget, "actor.pack_rows=true"], False),
            }
            result = {"env": env, "samples": len(batch), "real_tokens": real, "longest": longest}
            for side, (ov, padded) in sides.items():
                times, positions = time_update(batch, ov, model_dir, args.ub_repeats, padded)
                positions = real if side == "packed" else positions
                result[side] = {"update_s": statistics.median(times), "times": times,
                                "padding": 1 - real / positions, "positions": positions}
            result["generate"] = time_generate(batch, model_dir, args.ub_repeats)
            rows.append(result)
    return rows


def print_table(rows: list[dict], args) -> None:
    print(f"\nUpdate on a per-turn-sample batch (memory=window, {args.ub_episodes} episodes x {args.ub_turns} turns, "
          f"random tiny Qwen2, 1 rank, 1 thread; median of {args.ub_repeats} updates; same peak tokens per forward "
          f"pass: {args.ub_rows} rows x the longest row)")
    print("| env | samples | real tokens | longest row | padding before | padding after | update s before | "
          "update s after | speed-up | update s shared prefixes | speed-up shared | update s packed | "
          "speed-up packed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b, a, sh, p = r["before"], r["after"], r["shared"], r["packed"]
        print(f"| {r['env']} | {r['samples']} | {r['real_tokens']} | {r['longest']} | {b['padding']:.1%} | "
              f"{a['padding']:.1%} | {b['update_s']:.2f} | {a['update_s']:.2f} | "
              f"{b['update_s'] / a['update_s']:.2f}x | "
              f"{sh['update_s']:.2f} | {b['update_s'] / sh['update_s']:.2f}x | "
              f"{p['update_s']:.2f} | {b['update_s'] / p['update_s']:.2f}x |")
    print(f"\nGeneration over the same prompts (one HF-engine generate call, 24 new tokens; median of "
          f"{args.ub_repeats}, the sides alternating)")
    print("| env | prompts | generate s, every prompt whole | generate s, shared starts once | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        whole, shared = (statistics.median(r["generate"][k]) for k in ("whole", "shared"))
        print(f"| {r['env']} | {r['samples']} | {whole:.2f} | {shared:.2f} | {whole / shared:.2f}x |")
