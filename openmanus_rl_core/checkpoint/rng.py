"""The random-number state of a process (Python, numpy, torch, CUDA), captured into a checkpoint in
weights_only-safe form and restored from it."""

from __future__ import annotations

import logging
import random

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]

log = logging.getLogger(__name__)


def capture_rng_state() -> dict:
    """The Python, numpy (global) and torch RNG states in weights_only-safe form.

    ``{"python": [version, [625 ints], gauss_next], "numpy": {"bit_generator", "key": [624 ints],
    "pos", "has_gauss", "cached_gaussian"}, "torch": uint8 tensor, "cuda": [uint8 tensor per device]}``
    (``cuda`` only when CUDA is initialised).
    """
    version, internal, gauss_next = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": [int(version), [int(x) for x in internal], gauss_next],
        "numpy": {"bit_generator": str(name), "key": key.astype(np.int64).tolist(), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Undo :func:`capture_rng_state`: the next random numbers equal those drawn after the capture."""
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    if "numpy" in state:
        s = state["numpy"]
        np.random.set_state((s["bit_generator"], np.asarray(s["key"], dtype=np.uint32), int(s["pos"]),
                             int(s["has_gauss"]), float(s["cached_gaussian"])))
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = list(state["cuda"])
        if len(cuda) != torch.cuda.device_count():
            log.warning("RNG state has %d CUDA generators but %d devices are visible; CUDA RNG not restored",
                        len(cuda), torch.cuda.device_count())
        else:
            torch.cuda.set_rng_state_all([torch.as_tensor(t, dtype=torch.uint8).cpu() for t in cuda])

