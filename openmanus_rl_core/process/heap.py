"""Keeping Python's cyclic garbage collector off the objects a run keeps from set-up to the end.

After set-up a process holds a few hundred thousand long-lived objects: imported modules, the model's modules, the
tokenizer, the task rows. Python's full (generation 2) collection walks all of them every few training steps, in
the driver and in every worker: `python bench/gc_pauses.py` counts 474k objects beside one actor rank and times a
full collection at about 265 ms on 2 CPU cores. A lockstep step waits for its slowest process, so each pause
landed on the step: single steps of `python bench/trainer.py --only ours --steps 13` ran 0.2-0.35 s over the
median. :func:`freeze` moves every object alive at that point out of the collector's sight;
later full collections walk only what the run made since.
"""

from __future__ import annotations

import gc


def freeze() -> int:
    """Collect, then hide every live object from later collections; returns how many are hidden now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze() -> None:
    """Give the hidden objects back to the collector (a process that outlives the run, e.g. a test session, would
    otherwise never free a reference cycle among them)."""
    gc.unfreeze()
