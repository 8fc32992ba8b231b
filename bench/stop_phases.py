"""Stop a training run in each phase and time it: the seconds from the signal to the exit, the exit status, and
whether it printed the one "stopped ... continue with" line without a traceback.

    python bench/stop_phases.py            # every phase, SIGTERM; --signal SIGINT for Ctrl-C

Each phase is a real ``openmanus-rl train`` subprocess, signalled when its output shows the phase has begun (a
line the run prints there), after ``delay_s``. The settings make each phase long enough to land in.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = str(Path(sys.executable).parent / "openmanus-rl")
BASE = ["env=word_copy", "trainer.progress=false", "trainer.loggers=[]"]
SLOW_ENV = ["env=latency", "env.kwargs.inner=word_copy", "env.kwargs.median_ms=2500", "env.kwargs.sigma=0",
            "rollout.max_turns=1", "warmup.enabled=false", "trainer.val_before_train=false", "trainer.val_freq=0"]
# phase -> (extra overrides, the line that shows it began, seconds to wait after that line)
PHASES = {
    "model build": (["env.train_tasks=4000", "model.corpus_tasks=4000"], r"^recipe model=", 0.5),
    "Ray and workers start": ([], r"^built the tiny model", 0.5),
    "untrained validation": (["env.val_tasks=400"], r"actor worker\(s\) ready", 0.5),
    "warm-up": (["warmup.steps=3000"], r"^warm-up step 1/", 0.5),
    "rollout (slow env)": ([a for a in SLOW_ENV if not a.startswith("env=")], r"^step 1/", 0.5),
    "update": (["actor.ppo_epochs=40", "trainer.val_freq=0", "trainer.val_before_train=false",
                "warmup.enabled=false"], r"^step 1/", 0.3),
    # step 1's line comes after its validation; step 2's own is short, so 1 s later step 2 validates 1000 tasks
    "validation (mid-run)": (["env.val_tasks=1000", "trainer.val_freq=1", "trainer.val_before_train=false",
                              "warmup.enabled=false"], r"^step 1/", 1.0),
    "checkpoint": (["model.tiny.hidden_size=768", "model.tiny.num_layers=12", "model.tiny.intermediate_size=3072",
                    "trainer.save_freq=1", "trainer.val_freq=0", "trainer.val_before_train=false",
                    "warmup.enabled=false", "data.train_batch_size=2", "algorithm.n=2"], r"^step 1/", 0.0),
}


def stop_in(phase: str, signum: int, run_dir: Path) -> dict:
    extra, pattern, delay = PHASES[phase]
    env_name = ["env=latency"] if phase.startswith("rollout") else []
    args = [CLI, "train", *BASE, *env_name, *extra, "trainer.total_steps=50", f"trainer.run_dir={run_dir}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    out, sent = [], None
    for line in proc.stdout:
        out.append(line)
        if sent is None and re.search(pattern, line):
            time.sleep(delay)
            proc.send_signal(signum)
            sent = time.monotonic()
    status = proc.wait()
    text = "".join(out)
    stopped = [line for line in text.splitlines() if line.startswith("stopped by ")]
    return {"phase": phase, "exit": status, "stop_s": time.monotonic() - sent if sent else float("nan"),
            "one line": len(stopped) == 1 and "continue with: openmanus-rl train" in stopped[0],
            "traceback": "Traceback" in text, "kept": stopped[0].split("; ")[1] if stopped else "-"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", default="SIGTERM", choices=["SIGTERM", "SIGINT"])
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated phase names")
    args = parser.parse_args()
    signum = getattr(signal, args.signal)
    rows = []
    with tempfile.TemporaryDirectory(prefix="omrl-stop-") as tmp:
        for i, phase in enumerate(args.phases.split(",")):
            rows.append(stop_in(phase, signum, Path(tmp) / f"run{i}"))
            print(rows[-1], flush=True)
    print(f"\n{args.signal}, load average {os.getloadavg()[0]:.1f}")
    print(f"| phase | stop (s) | exit | one 'stopped ... continue with' line | traceback | kept |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['stop_s']:.1f} | {r['exit']} | {'yes' if r['one line'] else 'NO'} | "
              f"{'YES' if r['traceback'] else 'no'} | {r['kept']} |")


if __name__ == "__main__":
    main()
