"""Built-in allocators: hand-computed allocations, hypothesis properties, degenerate inputs, registry,
configs and the conformance kit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from openmanus_rl_core.protocols import Allocator
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_allocator
from openmanus_rl_allocators.allocators import (
    DiscountedAllocator,
    LastTokenAllocator,
    PerTurnAllocator,
    UniformPositiveAllocator,
)

CONFIGS = Path(__file__).resolve().parents[1] / "openmanus_rl_allocators" / "configs" / "allocator"
NAMES = {"last_token": LastTokenAllocator, "uniform_positive": UniformPositiveAllocator,
         "discounted": DiscountedAllocator, "per_turn": PerTurnAllocator}

# Response of 10 tokens: agent [1, 3), observation 3..5, agent [6, 9), one trailing observation token.
SEGS = [(1, 3), (6, 9)]
LEN = 10


# ------------------------------------------------------------------------------------ hand-computed
def test_last_token():
    assert LastTokenAllocator()(2.0, [0.5, 1.5], SEGS, LEN) == [0, 0, 0, 0, 0, 0, 0, 0, 2.0, 0]
    # The last NON-EMPTY segment: a trailing empty turn does not move the reward.
    assert LastTokenAllocator()(1.0, [0, 0, 1], SEGS + [(9, 9)], LEN)[8] == 1.0


def test_uniform_positive():
    out = UniformPositiveAllocator()(1.0, [0, 1], SEGS, LEN)
    assert out == pytest.approx([0, 0.2, 0.2, 0, 0, 0, 0.2, 0.2, 0.2, 0])
    assert UniformPositiveAllocator()(-1.0, [0, -1], SEGS, LEN) == [0, 0, 0, 0, 0, 0, 0, 0, -1.0, 0]
    assert UniformPositiveAllocator()(0.0, [0, 0], SEGS, LEN) == [0.0] * LEN


def test_discounted():
    out = DiscountedAllocator(gamma=0.5)(1.0, [0, 1], SEGS, LEN)
    # Agent tokens 1,2,6,7,8 -> k = 4,3,2,1,0 (observation tokens 3..5 skipped, not counted).
    assert out == [0, 0.0625, 0.125, 0, 0, 0, 0.25, 0.5, 1.0, 0]
    assert DiscountedAllocator(gamma=1.0)(2.0, [0, 2], SEGS, LEN) == [0, 2, 2, 0, 0, 0, 2, 2, 2, 0]
    assert DiscountedAllocator(gamma=0.0)(2.0, [0, 2], SEGS, LEN) == LastTokenAllocator()(2.0, [0, 2], SEGS, LEN)
    assert DiscountedAllocator().gamma == 0.99


def test_per_turn():
    assert PerTurnAllocator()(3.0, [1.0, 2.0], SEGS, LEN) == [0, 0, 1.0, 0, 0, 0, 0, 0, 2.0, 0]


def test_per_turn_empty_segments_carry_forward_or_back():
    segs = [(0, 0), (1, 3), (3, 3), (6, 9), (9, 9)]
    out = PerTurnAllocator()(15.0, [1.0, 2.0, 3.0, 4.0, 5.0], segs, LEN)
    # turn 0 (empty) -> next non-empty (turn 1, token 2); turn 2 (empty) -> turn 3 (token 8);
    # turn 4 (empty, nothing after) -> the last non-empty (token 8).
    assert out == [0, 0, 3.0, 0, 0, 0, 0, 0, 12.0, 0]


def test_per_turn_reward_mismatch_goes_to_last_token():
    out = PerTurnAllocator()(5.0, [1.0, 2.0], SEGS, LEN)
    assert out[2] == 1.0 and out[8] == 4.0 and sum(out) == 5.0


# ------------------------------------------------------------------------------------------ degenerate
@pytest.mark.parametrize("name", sorted(NAMES))
def test_no_agent_tokens_gives_zeros(name):
    alloc = NAMES[name]()
    assert alloc(1.0, [], [], 5) == [0.0] * 5
    assert alloc(1.0, [], [], 0) == []
    assert alloc(1.0, [1.0], [(0, 0)], 0) == []
    assert alloc(1.0, [0.5, 0.5], [(2, 2), (4, 4)], 5) == [0.0] * 5


@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize(
    "segments, length, match",
    [
        ([(0, 3), (2, 12)], 10, r"segment 1 = \(2, 12\) is outside \[0, 10\)"),
        ([(-1, 2)], 10, r"segment 0 = \(-1, 2\)"),
        ([(5, 3)], 10, r"segment 0 = \(5, 3\)"),
        ([(0, 4), (3, 6)], 10, r"segment 1 = \(3, 6\) overlaps"),
        ([(5, 7), (0, 2)], 10, r"segment 1 = \(0, 2\) overlaps or precedes segment 0"),
        ([(0, 1)], -1, "length must be an int >= 0"),
        ([(0,)], 10, "segment 0 must be a"),
    ],
)
def test_bad_segments_raise_naming_them(name, segments, length, match):
    with pytest.raises(ValueError, match=match):
        NAMES[name]()(1.0, [0.0] * len(segments), segments, length)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_non_finite_reward_raises(name):
    with pytest.raises(ValueError, match="reward must be a finite number"):
        NAMES[name]()(float("nan"), [0.0, 0.0], SEGS, LEN)


def test_per_turn_length_mismatch_and_bad_turn_reward():
    with pytest.raises(ValueError, match="1 turn rewards for 2 segments"):
        PerTurnAllocator()(1.0, [1.0], SEGS, LEN)
    with pytest.raises(ValueError, match=r"turn_rewards\[1\] must be a finite number"):
        PerTurnAllocator()(1.0, [1.0, float("inf")], SEGS, LEN)


def test_discounted_bad_gamma():
    for g in (-0.1, 1.5, "0.9", True):
        with pytest.raises(ValueError, match="gamma"):
            DiscountedAllocator(gamma=g)


# ---------------------------------------------------------------------------------------- properties
@st.composite
def layouts(draw):
    """Random ordered, disjoint segments (some empty) inside a response, with per-turn rewards."""
    n = draw(st.integers(0, 6))
    pos, segs = 0, []
    for _ in range(n):
        pos += draw(st.integers(0, 4))  # observation tokens before the turn
        size = draw(st.integers(0, 5))  # may be an empty segment
        segs.append((pos, pos + size))
        pos += size
    length = pos + draw(st.integers(0, 3))
    turn_rewards = draw(st.lists(st.floats(-10, 10), min_size=n, max_size=n))
    return segs, length, turn_rewards


def agent_mask(segs, length):
    mask = [False] * length
    for s, e in segs:
        for p in range(s, e):
            mask[p] = True
    return mask


@settings(max_examples=150, deadline=None)
@given(layout=layouts(), name=st.sampled_from(sorted(NAMES)), gamma=st.floats(0.0, 1.0))
def test_property_shape_and_zero_outside_segments(layout, name, gamma):
    segs, length, turn_rewards = layout
    reward = sum(turn_rewards)
    alloc = DiscountedAllocator(gamma) if name == "discounted" else NAMES[name]()
    out = alloc(reward, turn_rewards, segs, length)
    assert isinstance(out, list) and len(out) == length
    mask = agent_mask(segs, length)
    assert all(v == 0.0 for v, m in zip(out, mask) if not m)
    if name in ("last_token", "uniform_positive", "per_turn"):
        expected = reward if any(mask) else 0.0
        assert sum(out) == pytest.approx(expected, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(layout=layouts(), reward=st.floats(-10, 10), gamma=st.floats(0.0, 1.0))
def test_property_discounted_closed_form(layout, reward, gamma):
    segs, length, _ = layout
    out = DiscountedAllocator(gamma)(reward, [0.0] * len(segs), segs, length)
    positions = [p for p, m in enumerate(agent_mask(segs, length)) if m]
    for j, p in enumerate(positions):
        k = len(positions) - 1 - j  # agent tokens after p
        assert out[p] == pytest.approx(gamma**k * reward, abs=1e-12)
    if positions and gamma < 1:
        n = len(positions)
        assert sum(out) == pytest.approx(reward * (1 - gamma**n) / (1 - gamma), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(layout=layouts())
def test_property_per_turn_places_each_turn_on_its_last_token(layout):
    segs, length, turn_rewards = layout
    out = PerTurnAllocator()(sum(turn_rewards), turn_rewards, segs, length)
    nonempty = [(i, e - 1) for i, (s, e) in enumerate(segs) if e > s]
    for idx, (i, last) in enumerate(nonempty):
        if idx == len(nonempty) - 1:
            continue  # the last non-empty turn also collects trailing carries and rounding
        prev = nonempty[idx - 1][0] if idx else -1
        carried = sum(turn_rewards[prev + 1 : i + 1])  # empty turns before it, and its own
        assert out[last] == pytest.approx(carried, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(layout=layouts(), reward=st.floats(0.001, 10))
def test_property_uniform_positive_is_uniform(layout, reward):
    segs, length, _ = layout
    out = UniformPositiveAllocator()(reward, [0.0] * len(segs), segs, length)
    vals = [v for v, m in zip(out, agent_mask(segs, length)) if m]
    if vals:
        assert all(v == pytest.approx(reward / len(vals)) for v in vals)


# -------------------------------------------------------------------------------- registry and configs
@pytest.mark.parametrize("name", sorted(NAMES))
def test_registered_and_conform(name):
    assert registry("allocator").get(name) is NAMES[name]
    alloc = registry("allocator").build(name)
    assert isinstance(alloc, Allocator)
    check_allocator(alloc)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_discounted_variants_conform(gamma):
    check_allocator(DiscountedAllocator(gamma=gamma), rewards=(1.0, -0.5, 0.0, 123.0))


@pytest.mark.parametrize("name", sorted(NAMES))
def test_shipped_config_builds(name):
    cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
    assert cfg.name == name
    alloc = registry("allocator").build(cfg.name, **OmegaConf.to_container(cfg.kwargs))
    assert len(alloc(1.0, [0.25, 0.75], SEGS, LEN)) == LEN


def test_hook_contributes_config_dir():
    from openmanus_rl_allocators import hooks

    (d,) = hooks.openmanus_rl_config_dirs()
    assert {p.name for p in (Path(d) / "allocator").glob("*.yaml")} == {f"{n}.yaml" for n in NAMES}
