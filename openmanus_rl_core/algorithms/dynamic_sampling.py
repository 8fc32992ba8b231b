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


def keep_groups(episodes: Sequence[Any], accept: Callable[[Sequence[Trajectory]], bool]) -> tuple[list, list]:
    """The episodes of the groups ``accept`` keeps (groups by ``group_id``, in first-seen order), and the groups
    (each a list of its episodes) it dropped."""
    groups: dict[Any, list] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    kept, out = [], []
    for eps in groups.values():
        (kept if accept([e.trajectory for e in eps]) else out).append(eps)
    return [e for eps in kept for e in eps], out


def dropped_group(episodes: Sequence[Any], reason: str) -> dict[str, Any]:
    """What a record of the groups a step left out keeps of one (run/dumps.py: the step's ``dropped`` file)."""
    task = episodes[0].trajectory.task
    return {"task_id": task.get("task_id"), "task_row": task.get("task_row"), "seed": task.get("seed"),
            "source": task.get("source"), "group_id": str(episodes[0].group_id), "samples": len(episodes),
            "reason": reason}


def fill_batch(play: Callable[[list[dict], int], list], next_rows: Callable[..., list[dict]], n: int,
               accept: Callable[[Sequence[Trajectory]], bool], max_extra_groups: int,
               metrics: dict[str, float], dropped: list[dict] | None = None) -> list:
    """A lockstep step's episodes: B task rows (``next_rows()``) played (``play(rows, first_row_index)``), the
    groups without spread dropped, and more rows played in their place -- as many as the acceptance rate so far
    says are needed, at most ``max_extra_groups`` in all -- until B groups of ``n`` are kept. If none is kept, the
    first B groups of the last rows played (zero advantage: nothing to learn, but the step stays counted). Adds
    ``rollout/groups_filtered`` and ``rollout/groups_extra`` to ``metrics``; each group played and not trained goes
    to ``dropped`` (:func:`dropped_group`: reason ``no_spread``, or ``surplus`` for kept ones past the B-th)."""
    rows = next_rows()
    episodes = play(rows, 0)
    B, played = len(rows), len(rows)
    kept, out = keep_groups(episodes, accept)
    while len(kept) < B * n and played - B < max_extra_groups:
        accepted = len(kept) // n
        want = -(-(B - accepted) * played // max(accepted, 1))  # rows to play at the acceptance rate so far
        more = next_rows(min(want, max_extra_groups - (played - B)))
        episodes = play(more, played)
        played += len(more)
        k, o = keep_groups(episodes, accept)
        kept, out = kept + k, out + o
    metrics["rollout/groups_filtered"] = float(len(out))
    metrics["rollout/groups_extra"] = float(played - B)
    # The last refill may have played more than B rows: the step never trains more than B groups.
    trained = kept[:B * n] if kept else episodes[:B * n]
    if dropped is not None:
        chosen = {id(e) for e in trained}
        dropped += [dropped_group(eps, "no_spread") for eps in out if id(eps[0]) not in chosen]
        surplus: dict[Any, list] = {}
        for e in kept[B * n:]:
            surplus.setdefault(e.group_id, []).append(e)
        dropped += [dropped_group(eps, "surplus") for eps in surplus.values()]
    return trained
