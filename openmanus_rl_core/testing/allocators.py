"""Checks of an allocator: trajectory reward(s) and agent-token segments -> token-level rewards."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence


from .common import _fail, _built


def check_allocator(allocator: Callable[..., Sequence[float]] | type[Any],
                    rewards: Sequence[float] = (1.0, -0.5, 0.0)) -> None:
    """Check an allocator (a function or instance, or a class built with no arguments): right length, zero outside
    the agent segments, finite values."""
    allocator = _built(allocator, "check_allocator")
    cases = [
        ([(0, 4)], 4),
        ([(0, 3), (6, 9)], 12),
        ([(2, 5), (5, 5), (8, 10)], 10),
    ]
    for reward in rewards:
        for segments, length in cases:
            turn_rewards = [reward / len(segments)] * len(segments)
            where = f"allocator(reward={reward}, segments={segments}, length={length})"
            out = list(allocator(reward, turn_rewards, segments, length))
            if len(out) != length:
                _fail(where, f"returned {len(out)} values, expected {length}")
            inside = {i for s, e in segments for i in range(s, e)}
            for i, v in enumerate(out):
                if not math.isfinite(float(v)):
                    _fail(where, f"position {i} is {v}")
                if i not in inside and v != 0:
                    _fail(where, f"position {i} is outside every agent segment but got {v}")
            if reward != 0 and not any(out):
                _fail(where, "placed no reward at all")
