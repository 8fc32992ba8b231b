"""What is left of a local run after ``kill -9`` of its driver, and for how long.

    python bench/ray_leftovers.py [--repeats 1] [hydra overrides ...]

Starts ``openmanus-rl train`` (the smallest model, env=key_door) in its own session, waits until it is in its
training loop, kills the driver alone with SIGKILL, then prints every second which processes of the run are still
alive and where they listen, until none is. Nothing is left running at the end (the session is killed if needed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

SMALL = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=4", "algorithm.n=2",
    "env.train_tasks=8", "env.val_tasks=2", "rollout.max_new_tokens=8", "warmup.enabled=false",
    "trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=2", "trainer.val_before_train=false",
    "trainer.val_freq=0", "trainer.save_freq=0", "trainer.total_steps=1000",
]


def session(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def describe(p: psutil.Process) -> str:
    try:
        where = sorted({f"{c.laddr.ip}:{c.laddr.port}" for c in p.net_connections("inet")
                        if c.status == psutil.CONN_LISTEN})
        return f"{p.name()} {' '.join(where) or '(no listener)'}"
    except psutil.Error:
        return f"{p.pid} (gone)"


def once(overrides: list[str]) -> float:
    run_dir = Path(tempfile.mkdtemp(prefix="omrl-leftovers-")) / "run"
    cmd = [str(Path(sys.executable).parent / "openmanus-rl"), "train", "env=key_door", *SMALL,
           f"trainer.run_dir={run_dir}", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    try:
        while proc.poll() is None and not (metrics.exists() and any(
                json.loads(line)["step"] >= 1 for line in metrics.read_text().splitlines())):
            time.sleep(0.5)
        print(f"in the training loop; {len(session(proc.pid))} processes:")
        for p in session(proc.pid):
            print("  ", describe(p))
        t0 = time.time()
        proc.kill()
        proc.wait()
        while left := [p for p in session(proc.pid) if p.pid != proc.pid]:
            print(f"{time.time() - t0:5.1f}s after kill -9: " + "; ".join(describe(p) for p in left))
            time.sleep(1.0)
        gone = time.time() - t0
        print(f"nothing left {gone:.1f}s after kill -9")
        return gone
    finally:
        if session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args, overrides = parser.parse_known_args()
    times = [once(overrides) for _ in range(args.repeats)]
    print(f"all gone after {min(times):.1f}..{max(times):.1f}s over {len(times)} run(s)")


if __name__ == "__main__":
    main()
