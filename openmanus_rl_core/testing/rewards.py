"""Checks of a reward component (:class:`~openmanus_rl_core.protocols.RewardComponent`), and the trajectories
they run on."""

from __future__ import annotations

import math
from typing import Any, Sequence

from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn

from .common import _fail, _built


def sample_trajectories() -> list[Trajectory]:
    """A few varied trajectories: empty, single-turn success, multi-turn failure, invalid turns, env error."""
    def turn(text: str, valid: bool, reward: float, done: bool, span: tuple[int, int], **info: Any) -> Turn:
        kind = "action" if valid else "invalid"
        return Turn(text, ParsedAction(kind, text, valid), "ok", reward, done, dict(info), span)

    return [
        Trajectory(task_id=0, seed=0, group_id=0, initial_observation="start", termination="env_error",
                   error="server died"),
        Trajectory(task_id=1, seed=0, group_id=1, initial_observation="say apple", success=True,
                   turns=[turn("<action>apple</action>", True, 1.0, True, (0, 5), success=True)], response_length=5,
                   task={"ground_truth": "apple"}),
        Trajectory(task_id=2, seed=1, group_id=2, initial_observation="a room", success=False, termination="max_turns",
                   turns=[turn("<action>look</action>", True, 0.0, False, (0, 4)),
                          turn("garbage", False, 0.0, False, (10, 13), invalid=True),
                          turn("<action>open box</action>", True, 0.5, False, (20, 26))],
                   response_length=30, task={"ground_truth": "42"}),
    ]


def check_reward(component: Any, trajectories: Sequence[Trajectory] | None = None) -> None:
    """Check a reward component (an instance, or a class built with no arguments): finite values on varied
    trajectories, ``compute_turns`` consistent."""
    component = _built(component, "check_reward")
    if not callable(getattr(component, "compute", None)):
        _fail(type(component).__name__, "has no compute(trajectory)")
    for i, traj in enumerate(trajectories or sample_trajectories()):
        value = component.compute(traj)
        score = value.get("score") if isinstance(value, dict) else value
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            _fail(f"compute(trajectory {i})", f"must return a finite number (or a dict with 'score'), got {value!r}")
        turns_fn = getattr(component, "compute_turns", None)
        if callable(turns_fn):
            per_turn = list(turns_fn(traj))
            if len(per_turn) != len(traj.turns):
                _fail(f"compute_turns(trajectory {i})", f"returned {len(per_turn)} values for {len(traj.turns)} turns")
            if traj.turns and not math.isclose(sum(per_turn), float(score), rel_tol=1e-6, abs_tol=1e-9):
                _fail(f"compute_turns(trajectory {i})", f"sums to {sum(per_turn)} but compute() gave {score}")
