"""Benchmark: what one full garbage collection costs in a process that holds an actor rank, with and without
the set-up objects frozen (``openmanus_rl_core/process/heap.py``).

    python bench/gc_pauses.py [--collections 5]

One process builds what ``bench/trainer.py``'s in-process row builds (the embedded default's tiny Qwen2, its
tokenizer, one :class:`~openmanus_rl_core.workers.ActorWorker` with its engine, one thread) and plays 2 GRPO steps.
Then it times ``gc.collect()`` (a full, generation-2 collection) ``--collections`` times and counts the objects the
collector tracks; then it freezes the heap as every worker does once set up, and does both again. The table gives
the median collection time and the objects walked, before and after.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def full_collection(times: int) -> tuple[float, int]:
    """Median seconds of ``times`` full collections, and the objects a collection walks."""
    seconds = []
    for _ in range(times):
        t0 = time.perf_counter()
        gc.collect()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds), len(gc.get_objects())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collections", type=int, default=5, help="full collections timed on each side")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import trainer as bench_trainer

    from openmanus_rl_core.process import heap

    with tempfile.TemporaryDirectory() as tmp:
        spec = bench_trainer.build_inputs(bench_trainer.parse_args(["--threads", "1"]), Path(tmp))
        spec["threads"] = 1
        rank = bench_trainer.InProcessGRPO(spec)
        try:
            for step in (1, 2):
                rank.step(step)
            before = full_collection(args.collections)
            frozen = heap.freeze()
            after = full_collection(args.collections)
        finally:
            rank.worker.shutdown()
    print(f"one actor rank in this process (tiny Qwen2, 1 thread), {args.collections} full collections per side; "
          f"1-minute load average {os.getloadavg()[0]:.1f}")
    print(f"{'heap':<10} {'objects walked':>15} {'median ms':>10}")
    print(f"{'as built':<10} {before[1]:>15,} {before[0] * 1000:>10.1f}")
    print(f"{'frozen':<10} {after[1]:>15,} {after[0] * 1000:>10.1f}   ({frozen:,} objects frozen)")


if __name__ == "__main__":
    main()
