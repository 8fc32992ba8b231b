"""Reward components that fail during training are loud (``reward.on_error``).

The composer scores a failed sample 0 and keeps the message (:class:`~openmanus_rl_core.rewards.composer.RewardBreakdown`
``errors``), so one bad sample never stops a batch. A component that fails on *every* sample of a step is a bug,
not noise: a run trained on it would learn from a reward stuck at 0. So, after each step's rewards are composed:

- a component that failed on every sample it scored (an ``env=mix`` source's own component scores that source's)
  stops the run (:class:`RewardFailure`, exit 1) with one line naming it, its exception and one trajectory; with
  ``reward.on_error=warn`` that is a console line and the run goes on;
- a component that failed on some samples prints one console line for the step, with the count.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


# reward.on_error -> whether a component failing on every sample stops the run
STOPS = {"raise": True, "warn": False}


class RewardFailure(RuntimeError):
    """A reward component failed on every sample of a training step (``reward.on_error=raise``)."""


def _one_trajectory(trajectory: Any) -> str:
    reply = " ".join(str(trajectory.final_response or "").split())
    reply = reply if len(reply) <= 80 else reply[:77] + "..."
    return f"task_id={trajectory.task_id}, {trajectory.num_turns} turn(s), last reply {reply!r}"


def check_reward_failures(labels: Sequence[str], breakdowns: Sequence[Any], trajectories: Sequence[Any],
                          step: int, on_error: str, log: Callable[[str], None]) -> None:
    """One console line per component that failed on some of the step's samples; :class:`RewardFailure` for one
    that failed on all of them, unless ``on_error == "warn"``."""
    for label in labels:
        failed = [i for i, b in enumerate(breakdowns) if label in b.errors]
        if not failed:
            continue
        total = sum(label in b.parts for b in breakdowns)  # the samples it scored (an env=mix source's: its own)
        first = failed[0]
        what = (f"reward {label!r} failed on {len(failed)} of {total} samples at step {step} (scored 0 there): "
                f"{breakdowns[first].errors[label]}")
        if len(failed) == total and STOPS[on_error]:
            raise RewardFailure(f"{what}; one of them: {_one_trajectory(trajectories[first])}. Every sample failed, "
                                f"so the run stopped (reward.on_error=warn goes on)")
        log(("WARNING: " if len(failed) == total else "") + what)
