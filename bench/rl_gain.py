"""Benchmark: what RL adds on a real benchmark, against a supervised control given the same wall time.

    python bench/rl_gain.py [--preset babyai_goto] [--seeds 0,1,2] [--val-tasks 120] [--json out.json]
                            [--keep DIR] [hydra overrides ...]

For each seed, two runs of ``openmanus-rl train`` in fresh processes:

- **warm-up + RL**: ``+experiment=<preset> seed=<s>``. Validation (greedy, ``--val-tasks`` tasks) after the warm-up
  and after the last RL step.
- **supervised control**: the same preset and seed with ``trainer.total_steps=0`` (the warm-up alone) and the
  warm-up lengthened to fill the first run's warm-up + RL wall time: ``warmup.steps`` scaled by
  (warm-up seconds + RL seconds) / warm-up seconds, where RL seconds is the sum of the RL steps' ``timing/step``
  (validation excluded on both sides).

The table gives each validation's success rate with its 95% Wilson interval, RL's own gain (final minus after the
warm-up), the control's success, and each run's wall time; the load average is printed before and after each run.
Take numbers on a quiet machine. ``--keep DIR`` keeps each run's folder (``rl_<seed>``, ``sft_<seed>``: metrics and
validation samples) under DIR instead of a temporary folder.
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
from pathlib import Path

QUIET = ["trainer.progress=false", "trainer.val_before_train=false", "trainer.save_at_end=false",
         "trainer.save_freq=0"]


def train(overrides: list[str], run_dir: Path) -> tuple[list[dict], float]:
    """One ``openmanus-rl train`` in a fresh process: its metrics rows and its wall time."""
    cmd = [sys.executable, "-m", "openmanus_rl_core.cli", "train", *QUIET, *overrides, f"trainer.run_dir={run_dir}"]
    print(f"  load {os.getloadavg()[0]:.1f}: {' '.join(cmd[3:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    print(f"  load {os.getloadavg()[0]:.1f}: done in {wall:.0f}s", flush=True)
    return rows, wall


def interval(row: dict, prefix: str) -> str:
    return (f"{row[f'{prefix}/success_rate']:.3f} [{row[f'{prefix}/success_ci_low']:.2f}, "
            f"{row[f'{prefix}/success_ci_high']:.2f}]")


def one_seed(preset: str, seed: int, val_tasks: int, extra: list[str], tmp: Path) -> dict:
    base = [f"+experiment={preset}"] * bool(preset) + [f"seed={seed}", f"env.val_tasks={val_tasks}", *extra]
    rows, wall = train(base, tmp / f"rl_{seed}")
    first, last = rows[0], rows[-1]
    warm_s = first["warmup/seconds"]
    rl_s = sum(r["timing/step"] for r in rows[1:])
    steps = int(first["warmup/steps"])
    control_steps = round(steps * (warm_s + rl_s) / warm_s)
    crows, cwall = train(base + ["trainer.total_steps=0", f"warmup.steps={control_steps}"], tmp / f"sft_{seed}")
    control = crows[0]
    return {
        "seed": seed, "warmup_steps": steps, "warmup_s": warm_s, "rl_steps": last["step"], "rl_s": rl_s,
        "after_warmup": first["warmup/val/success_rate"], "final": last["val/success_rate"],
        "gain": last["val/success_rate"] - first["warmup/val/success_rate"],
        "control_steps": control_steps, "control_s": control["warmup/seconds"],
        "control": control["warmup/val/success_rate"],
        "text": {"after_warmup": interval(first, "warmup/val"), "final": interval(last, "val"),
                 "control": interval(control, "warmup/val")},
        "wall_s": wall, "control_wall_s": cwall,
    }


def table(results: list[dict], val_tasks: int) -> None:
    print(f"\nvalidation success on {val_tasks} tasks (greedy), 95% Wilson interval in brackets\n")
    print("| seed | after warm-up | after RL | RL's own gain | supervised control (same time) | "
          "warm-up / RL / control seconds | wall (RL run, control) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        t = r["text"]
        print(f"| {r['seed']} | {t['after_warmup']} ({r['warmup_steps']} steps) | {t['final']} ({r['rl_steps']} steps) "
              f"| {r['gain']:+.3f} | {t['control']} ({r['control_steps']} steps) | "
              f"{r['warmup_s']:.0f} / {r['rl_s']:.0f} / {r['control_s']:.0f} | "
              f"{r['wall_s']:.0f}s, {r['control_wall_s']:.0f}s |")
    if len(results) > 1:
        m = {k: statistics.mean(r[k] for r in results) for k in ("after_warmup", "final", "gain", "control")}
        print(f"| mean | {m['after_warmup']:.3f} | {m['final']:.3f} | {m['gain']:+.3f} | {m['control']:.3f} | | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="babyai_goto", help="an +experiment option ('': the embedded default)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--val-tasks", type=int, default=120)
    p.add_argument("--json", default=None)
    p.add_argument("--keep", default=None, help="a folder that keeps each run's folder (default: a temporary one)")
    args, extra = p.parse_known_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.keep or tmp)
        runs.mkdir(parents=True, exist_ok=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            print(f"seed {seed}", flush=True)
            results.append(one_seed(args.preset, seed, args.val_tasks, extra, runs))
    table(results, args.val_tasks)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
