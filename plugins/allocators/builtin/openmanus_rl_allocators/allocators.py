"""Built-in reward allocators: place a trajectory's reward on its response tokens.

Every allocator is a class built as ``cls(**kwargs)`` from ``configs/allocator/<name>.yaml`` whose
instances are called as ``allocator(reward, turn_rewards, segments, length) -> list[float]``
(:class:`~openmanus_rl_core.protocols.Allocator`): ``length`` floats, 0 outside the agent segments.

=====================  ===================================================================  ==============
name                   where the reward goes                                                sum preserved
=====================  ===================================================================  ==============
``last_token``         all of ``reward`` on the last agent token                            yes
``uniform_positive``   ``reward > 0``: ``reward / N`` on each of the N agent tokens;         yes
                       ``reward <= 0``: all on the last agent token
``discounted``         ``gamma**k * reward`` on each agent token, k = agent tokens after it  no
``per_turn``           ``turn_rewards[i]`` on the last token of segment i                   yes
=====================  ===================================================================  ==============

Input rules, shared by all (a bad input raises ``ValueError`` naming it):

- ``length`` is an int >= 0 and ``reward`` / ``turn_rewards`` are finite numbers;
- each segment ``(start, end)`` satisfies ``0 <= start <= end <= length``; an empty segment
  (``start == end``) is allowed and holds no token;
- non-empty segments are in order and do not overlap.

No agent token at all (no segments, only empty ones, or ``length == 0``) gives all zeros: the reward
has nowhere to go, so "sum preserved" holds only when there is at least one agent token.
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = [
    "LastTokenAllocator",
    "UniformPositiveAllocator",
    "DiscountedAllocator",
    "PerTurnAllocator",
    "validate",
    "agent_positions",
]


def _finite(what: str, value: float) -> float:
    """``float(value)`` (numpy scalars and 0-d tensors welcome) if it is a finite number, else ValueError."""
    try:
        out = float(value) if not isinstance(value, (bool, str, bytes)) else math.nan
    except (TypeError, ValueError):
        out = math.nan
    if not math.isfinite(out):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return out


def validate(reward: float, segments: Sequence[Sequence[int]], length: int) -> list[tuple[int, int]]:
    """Check the inputs (see the module docstring); return the segments as ``(int, int)`` tuples."""
    _finite("reward", reward)
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    out: list[tuple[int, int]] = []
    prev_end, prev_i = 0, None
    for i, seg in enumerate(segments):
        try:
            start, end = (int(x) for x in seg)
        except (TypeError, ValueError):
            raise ValueError(f"segment {i} must be a (start, end) pair of ints, got {seg!r}") from None
        if not 0 <= start <= end <= length:
            raise ValueError(
                f"segment {i} = ({start}, {end}) is outside [0, {length}) of the response "
                f"(need 0 <= start <= end <= length={length})"
            )
        if start < end:
            if start < prev_end:
                raise ValueError(
                    f"segment {i} = ({start}, {end}) overlaps or precedes segment {prev_i} which ends at "
                    f"{prev_end}; agent segments must be in order and disjoint"
                )
            prev_end, prev_i = end, i
        out.append((start, end))
    return out


def agent_positions(segments: Sequence[tuple[int, int]]) -> list[int]:
    """Token positions of every agent token, in order."""
    return [p for start, end in segments for p in range(start, end)]


def _last_agent_token(segments: Sequence[tuple[int, int]]) -> int | None:
    for start, end in reversed(segments):
        if end > start:
            return end - 1
    return None


class LastTokenAllocator:
    """All of ``reward`` on the last token of the last non-empty segment (the usual outcome reward)."""

    def __call__(self, reward, turn_rewards, segments, length):
        segs = validate(reward, segments, length)
        out = [0.0] * length
        last = _last_agent_token(segs)
        if last is not None:
            out[last] = float(reward)
        return out


class UniformPositiveAllocator:
    """A positive ``reward`` spread evenly: ``reward / N`` on each of the N agent tokens (sum ==
    reward). A zero or negative ``reward`` goes on the last agent token alone, so a failure is not
    smeared over tokens that may have been right."""

    def __call__(self, reward, turn_rewards, segments, length):
        segs = validate(reward, segments, length)
        out = [0.0] * length
        positions = agent_positions(segs)
        if not positions:
            return out
        if reward > 0:
            share = float(reward) / len(positions)
            for p in positions:
                out[p] = share
        else:
            out[positions[-1]] = float(reward)
        return out


class DiscountedAllocator:
    """``reward`` on the last agent token, discounted backwards over agent tokens only::

        r_t = gamma**k * reward,   k = number of agent tokens after t

    Observation tokens (between segments) are skipped: they get 0 and do not count in ``k``. The sum is
    NOT preserved: it is ``reward * (1 - gamma**N) / (1 - gamma)`` for N agent tokens (``N * reward``
    when ``gamma == 1``). ``gamma`` in [0, 1]; ``gamma == 0`` is ``last_token``.
    """

    def __init__(self, gamma: float = 0.99):
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
            raise ValueError(f"discounted allocator gamma must be a number in [0, 1], got {gamma!r}")
        self.gamma = float(gamma)

    def __call__(self, reward, turn_rewards, segments, length):
        segs = validate(reward, segments, length)
        out = [0.0] * length
        value = float(reward)
        for p in reversed(agent_positions(segs)):  # k = 0 at the last agent token
            out[p] = value
            value *= self.gamma
        return out


class PerTurnAllocator:
    """Each turn's reward on the last token of that turn's segment: ``turn_rewards[i]`` at
    ``segments[i][1] - 1``.

    An empty segment's reward is carried to the next non-empty segment, or, if none follows, to the
    last non-empty one before it. ``reward - sum(turn_rewards)`` (0 when the caller keeps the protocol's
    "same sum") is added on the last agent token, so the allocation always sums to ``reward``.
    ``len(turn_rewards)`` must equal ``len(segments)``.
    """

    def __call__(self, reward, turn_rewards, segments, length):
        segs = validate(reward, segments, length)
        turn_rewards = [_finite(f"turn_rewards[{i}]", r) for i, r in enumerate(turn_rewards)]
        if len(turn_rewards) != len(segs):
            raise ValueError(
                f"per_turn needs one turn reward per segment: got {len(turn_rewards)} turn rewards for "
                f"{len(segs)} segments"
            )
        out = [0.0] * length
        last = _last_agent_token(segs)
        if last is None:
            return out
        carry = 0.0
        for (start, end), r in zip(segs, turn_rewards):
            carry += r
            if end > start:
                out[end - 1] += carry
                carry = 0.0
        # Rewards of trailing empty segments, and any mismatch between reward and the turn rewards.
        out[last] += carry + (float(reward) - sum(turn_rewards))
        return out
