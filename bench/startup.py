"""How long a training run takes to reach its first step, phase by phase.

    python bench/startup.py [--repeats 3] [--src DIR] [hydra overrides ...]

Runs ``openmanus-rl train`` (env=key_door and the smallest tiny model: the plugin kit's ``SMALL_RUN``, cut to one
step with nothing warmed up, saved or validated) in a fresh process ``--repeats`` times and prints, for each run and
as the median, the seconds from the start of the process to each line that ends a phase: the model folder built,
the workers ready, step 1 done, and the process gone. ``--src`` runs the code of another checkout (its folder goes
first on PYTHONPATH), so two versions compare on the same machine and venv. The extra overrides go last (e.g.
``env=babyai`` for an env whose model folder takes longer).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openmanus_rl_core.testing.common import SMALL_RUN

# later overrides win
SMALL = [*SMALL_RUN, "warmup.enabled=false", "trainer.loggers=[]", "trainer.val_at_end=false", "trainer.save_freq=0",
         "trainer.save_at_end=false", "trainer.total_steps=1"]
# (column, the text of the line that ends the phase)
PHASES = [("model folder", "built the tiny model"), ("workers ready", " actor worker(s) ready"), ("step 1", "step 1/1")]


def one_run(src: str | None, extra: list[str]) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        cmd = [sys.executable, "-m", "openmanus_rl_core.cli", "train", *SMALL, f"trainer.run_dir={tmp}/run", *extra]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)  # line by line: a line is timed when it is printed
        seen: dict[str, float] = {}
        tail = collections.deque(maxlen=20)
        for line in proc.stdout:
            tail.append(line)
            for column, text in PHASES:
                if text in line and column not in seen:
                    seen[column] = time.perf_counter() - t0
        proc.wait()
        seen["exit"] = time.perf_counter() - t0
    if proc.returncode != 0 or len(seen) != len(PHASES) + 1:
        sys.exit(f"the run failed (exit {proc.returncode}); its last lines:\n{''.join(tail)}")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--src", default=None, help="a checkout whose code runs instead of the installed one")
    args, extra = ap.parse_known_args()
    columns = [c for c, _ in PHASES] + ["exit"]
    print(f"code: {args.src or 'installed'}; load average at start {os.getloadavg()[0]:.2f}")
    print("| run | " + " | ".join(f"{c} s" for c in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    runs = []
    for k in range(args.repeats):
        runs.append(one_run(args.src, extra))
        print(f"| {k + 1} | " + " | ".join(f"{runs[-1][c]:.1f}" for c in columns) + " |", flush=True)
    print("| median | " + " | ".join(f"{statistics.median(r[c] for r in runs):.1f}" for c in columns) + " |")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
