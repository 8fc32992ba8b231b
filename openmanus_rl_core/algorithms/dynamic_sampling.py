"""DAPO's dynamic sampling (``algorithm.filter_groups``): a group whose samples all score the same gets zero
advantage under a group baseline and trains nothing, so it never reaches the loss; another group is sampled in its
place, up to ``max_extra_groups`` per step (docs/async.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openmanus_rl_core.protocols import Trajectory


def has_spread(values: Sequence[float], tol: float = 1e-9) -> bool:
    """True when the values are not all equal (max - min > ``tol``); a group of one has no spread."""
    return len(values) > 1 and max(values) - min(values) > tol


class GroupFilter:
    """``filter(trajectories) -> bool``: keep the group when its ``metric`` varies.

    ``metric``: ``reward`` (the composer's total per trajectory) or ``success``.
    """

    def __init__(self, composer: Any, metric: str):
        metrics: dict[str, Callable[[Sequence[Trajectory]], list[float]]] = {
            "reward": lambda trajs: [b.total for b in composer.compose_batch(trajs)[0]],
            "success": lambda trajs: [float(bool(t.success)) for t in trajs],
        }
        if metric not in metrics:
            raise ValueError(f"algorithm.filter_groups.metric={metric!r}: one of {sorted(metrics)}")
        self.values = metrics[metric]

    def __call__(self, trajectories: Sequence[Trajectory]) -> bool:
        return has_spread(self.values(trajectories))


def keep_groups(episodes: Sequence[Any], accept: Callable[[Sequence[Trajectory]], bool]) -> tuple[list, int]:
    """The episodes of the groups ``accept`` keeps (groups by ``group_id``, in first-seen order), and how many
    groups it dropped."""
    groups: dict[Any, list] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    kept = [eps for eps in groups.values() if accept([e.trajectory for e in eps])]
    return [e for eps in kept for e in eps], len(groups) - len(kept)
