"""Benchmark: lockstep rollout against episodes on their own and the bounded-staleness group stream.

    python bench/async.py [--repeats 3] [--steps 6] [--rows a,b,c,d,e] [--json out.json] [hydra overrides ...]

Every row is ``openmanus-rl train`` in a fresh process, on the embedded default's model behind the ``latency`` env
(key_door, each step waiting a seeded lognormal time: median 50 ms, sigma 1.2), 16 tasks x 8 samples = 128
episodes per step, a short supervised warm-up (so replies and episode lengths are those of a learning policy), no
validation. Rows:

- (a) ``rollout.mode=lockstep``: today's loop, each turn waits for its slowest env call;
- (b) ``rollout.mode=episodes``: each episode moves on when its own env call returns; still on-policy (eta 0);
- (c)-(e) ``rollout.max_staleness=1, 2, 4``: the group stream, rollouts keep running while the trainer updates.

Columns, over steps 2..N of each run (step 1 fills the stream and pays one-time costs), median over the repeats:

- samples/s: trained episodes per second of step wall time;
- s/step: the median step time;
- rollout-wait share: the share of the step the trainer spends waiting for episodes (``timing/rollout`` /
  ``timing/step``: for (a) and (b) the whole rollout, env waits included; for the stream only the wait for
  the batch's last groups);
- staleness: the mean staleness of the trained samples (``stream/staleness_mean``, 0 without the stream).

The machine's load average is printed before and after each row; take numbers on a quiet machine.
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

ROWS = {
    "a": ("(a) lockstep", ["rollout.mode=lockstep"]),
    "b": ("(b) episodes, eta=0", ["rollout.mode=episodes"]),
    "c": ("(c) stream, eta=1", ["rollout.max_staleness=1"]),
    "d": ("(d) stream, eta=2", ["rollout.max_staleness=2"]),
    "e": ("(e) stream, eta=4", ["rollout.max_staleness=4"]),
}
COMMON = ["env=latency", "data.train_batch_size=16", "rollout.n=8", "warmup.steps=60", "trainer.val_freq=0",
          "trainer.val_before_train=false", "trainer.val_at_end=false", "warmup.validate=false",
          "trainer.progress=false", "trainer.save_freq=0"]


def run_row(overrides: list[str], steps: int, out_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "openmanus_rl_core.cli", "train", *COMMON, f"trainer.total_steps={steps}",
           f"trainer.output_dir={out_dir}", *overrides]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    metrics = next(out_dir.rglob("metrics.jsonl"))
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steps_rows = [r for r in rows if r.get("step", 0) >= 2 and "timing/step" in r]
    step_s = [r["timing/step"] for r in steps_rows]
    episodes = [r.get("stream/groups", 16) * 8 for r in steps_rows]
    return {
        "samples_per_s": sum(episodes) / sum(step_s),
        "step_s": statistics.median(step_s),
        "wait_share": statistics.median(r["timing/rollout"] / r["timing/step"] for r in steps_rows),
        "staleness": statistics.mean(r.get("stream/staleness_mean", 0.0) for r in steps_rows),
        "load": (load_before, os.getloadavg()[0]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rows", default="a,b,c,d,e")
    p.add_argument("--json", default=None)
    args, extra = p.parse_known_args()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):  # rows interleaved: a slow minute hurts every row alike
            for key in args.rows.split(","):
                name, overrides = ROWS[key]
                r = run_row([*overrides, *extra], args.steps, Path(tmp) / f"{key}{rep}")
                results.setdefault(key, []).append(r)
                print(f"{name} run {rep + 1}: {r['samples_per_s']:.1f} samples/s, {r['step_s']:.2f} s/step, "
                      f"load {r['load'][0]:.1f} -> {r['load'][1]:.1f}", flush=True)
    base = statistics.median(r["samples_per_s"] for r in results[args.rows.split(",")[0]])
    print(f"\n| row | samples/s | vs first row | s/step | rollout-wait share | staleness | load avg |")
    print("|---|---|---|---|---|---|---|")
    for key, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("samples_per_s", "step_s", "wait_share",
                                                                   "staleness")}
        loads = f"{min(r['load'][0] for r in runs):.1f}-{max(r['load'][1] for r in runs):.1f}"
        print(f"| {ROWS[key][0]} | {med['samples_per_s']:.1f} | {med['samples_per_s'] / base:.2f}x | "
              f"{med['step_s']:.2f} | {med['wait_share']:.2f} | {med['staleness']:.2f} | {loads} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
