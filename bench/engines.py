"""Benchmark: the embedded default trained with the HF engine and with the vLLM engine, validation and step times.

    python bench/engines.py [--steps 10] [--seeds 0,1] [--engines hf,vllm]

Run it in ``.venv-vllm`` (``make test-vllm`` builds it): both engines then run on the same torch build. For each
engine and seed it runs, one after the other in a fresh process each,

    openmanus-rl train [rollout.engine=vllm] trainer.total_steps=<steps> [seed=<seed>, when not 0]

-- the embedded default with no other override (warm-up, validation at step 0 and at the end included) -- and
prints one table row from the run's ``metrics.jsonl``: the validation success rate and reward at step 0 (the
untrained model), after the warm-up and at the last step; the mean, min and max of ``timing/step`` over steps 2..N
(step 1 pays one-time costs) and of ``timing/rollout``; the run's wall time. The machine's load average is printed
before and after each run: on a shared machine the step times move with it.
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


def run(engine: str, seed: int, steps: int) -> dict:
    # Seed 0 is the default: its commands are exactly the embedded default's plus the step count.
    cmd = [str(Path(sys.executable).parent / "openmanus-rl"), "train", f"trainer.total_steps={steps}"]
    if engine != "hf":
        cmd.insert(2, f"rollout.engine={engine}")
    if seed != 0:
        cmd.append(f"seed={seed}")
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")))
    memory = [line.split("): ", 1)[1] for line in (proc.stdout + proc.stderr).splitlines()
              if "VLLMEngine memory" in line]
    return {"engine": engine, "seed": seed, "cmd": "openmanus-rl " + " ".join(cmd[1:]), "wall": wall,
            "load": (load_before, os.getloadavg()[0]), "memory": memory[:1], **summarize(run_dir)}


def summarize(run_dir: Path) -> dict:
    """Validation and step times of one run, from its ``metrics.jsonl``."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    first = next(r for r in rows if r["step"] == 0)
    last = max((r for r in rows if "val/success_rate" in r), key=lambda r: r["step"])
    timed = [r for r in rows if r["step"] >= 2 and "timing/step" in r]
    step_s = [r["timing/step"] for r in timed]
    rollout_s = [r["timing/rollout"] for r in timed]
    return {
        "run_dir": str(run_dir),
        "val0": first["val/success_rate"], "val_warm": first.get("warmup/val/success_rate"),
        "val_last": last["val/success_rate"], "reward_last": last["val/reward_mean"], "last_step": last["step"],
        "step_mean": statistics.mean(step_s), "step_min": min(step_s), "step_max": max(step_s),
        "rollout_mean": statistics.mean(rollout_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--engines", default="hf,vllm")
    args = ap.parse_args()
    print(f"| engine | seed | val success step 0 | after warm-up | step {args.steps} | val reward step "
          f"{args.steps} | s/step (mean) | min | max | rollout s (mean) | run wall s | load avg before -> after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for engine in args.engines.split(","):
            r = run(engine, seed, args.steps)
            warm = f"{r['val_warm']:.3f}" if r["val_warm"] is not None else "-"
            print(f"| {r['engine']} | {r['seed']} | {r['val0']:.3f} | {warm} | {r['val_last']:.3f} | "
                  f"{r['reward_last']:.3f} | {r['step_mean']:.2f} | {r['step_min']:.2f} | {r['step_max']:.2f} | "
                  f"{r['rollout_mean']:.2f} | {r['wall']:.0f} | {r['load'][0]:.1f} -> {r['load'][1]:.1f} |"
                  f"{'  <!-- ' + r['memory'][0] + ' -->' if r['memory'] else ''}", flush=True)


if __name__ == "__main__":
    main()
