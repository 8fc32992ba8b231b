"""What keeping every trained batch costs: `trainer.save_rollouts=true` on the embedded default.

    python bench/dumps.py [--steps 8] [--runs 3]

Each run is the embedded default (`openmanus-rl train` with no overrides but these) in a fresh process, with
validation and checkpoints off so a step is rollout + update + the dump. The trainer times the dump on its own
(`timing/dump` in metrics.jsonl, inside `timing/step`), so one run gives both sides: the dump's share of the step is
dump / (step - dump), per step, and the table shows the median over the steps of each run, then over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent


def one_run(steps: int, folder: Path) -> dict[str, float]:
    run = folder / "run"
    cmd = [str(BIN / "openmanus-rl"), "train", f"trainer.total_steps={steps}", "trainer.val_freq=0",
           "trainer.val_before_train=false", "trainer.val_at_end=false", "trainer.save_freq=0",
           "trainer.save_at_end=false", "trainer.loggers=[]", "trainer.progress=false", "trainer.save_rollouts=true",
           f"trainer.run_dir={run}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 1 and "timing/dump" in r]
    shares = [r["timing/dump"] / (r["timing/step"] - r["timing/dump"]) for r in rows]
    sizes = [p.stat().st_size for p in (run / "rollouts").iterdir()]
    return {"share": statistics.median(shares), "dump_ms": 1000 * statistics.median(r["timing/dump"] for r in rows),
            "step_s": statistics.median(r["timing/step"] - r["timing/dump"] for r in rows),
            "samples": statistics.median(r["perf/samples"] for r in rows), "kib": statistics.median(sizes) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="omrl-bench-dumps-") as d:
            results.append(one_run(args.steps, Path(d)))
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in results[-1].items()), file=sys.stderr)
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("| samples per step | step without the dump (s) | dump (ms) | dump file (KiB) | dump / step | target |")
    print("|---:|---:|---:|---:|---:|---|")
    runs = ", ".join(f"{100 * r['share']:.2f}%" for r in results)
    print(f"| {med['samples']:.0f} | {med['step_s']:.2f} | {med['dump_ms']:.1f} | {med['kib']:.0f} | "
          f"{100 * med['share']:.2f}% (runs: {runs}) | <= 5% |")


if __name__ == "__main__":
    main()
