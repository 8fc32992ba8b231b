"""A worker's RNG states, saved with checkpoints and restored on resume."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Mapping

import torch


def capture_worker_rng(extra_generators: Mapping[str, torch.Generator] | None = None) -> dict:
    """This process's RNG states (python, numpy, torch; see :func:`checkpoint.capture_rng_state`) plus the states
    of named ``torch.Generator`` objects (e.g. the rollout engine's sampler). weights_only-safe."""
    from openmanus_rl_core.checkpoint.rng import capture_rng_state

    return {"process": capture_rng_state(),
            "generators": {k: g.get_state() for k, g in (extra_generators or {}).items()}}


def restore_worker_rng(state: Mapping, extra_generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Undo :func:`capture_worker_rng`."""
    from openmanus_rl_core.checkpoint.rng import restore_rng_state

    restore_rng_state(dict(state["process"]))
    for k, g in (extra_generators or {}).items():
        if k in state.get("generators", {}):
            g.set_state(state["generators"][k])


@contextmanager
def saved_generator(gen: torch.Generator):
    """Runs the block, then puts ``gen`` back to the state it had (validation must not shift training samples)."""
    state = gen.get_state()
    try:
        yield
    finally:
        gen.set_state(state)

