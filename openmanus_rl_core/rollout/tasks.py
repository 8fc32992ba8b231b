"""Tasks into episodes: expanding a task into its group of samples, and starting a task on an env."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any


def expand_tasks(tasks: Sequence[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` interleaved copies of each task (``a, a, b, b`` for n=2), each copy carrying its task's ``group_id``
    and its place in the group, ``sample_index`` (0 .. n-1).

    A task that already has a ``group_id`` keeps it; otherwise its copies share a fresh uuid hex. ``task_id`` and
    ``seed`` are the same within a group (so every sample starts from the same state). ``sample_index`` lets the
    samples of a group tell themselves apart deterministically (self-play: sample ``k`` plays seat ``k % seats``
    of game ``k // seats``).
    """
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    out: list[dict[str, Any]] = []
    for task in tasks:
        gid = task.get("group_id") or uuid.uuid4().hex
        for k in range(int(n)):
            copy = dict(task)
            copy["group_id"] = gid
            copy["sample_index"] = k
            out.append(copy)
    return out

def start_task(env: Any, task: Mapping[str, Any]) -> str:
    """Start ``task`` on ``env``: from its whole row where the env reads rows (``env.start_task(task)``: a mix of envs
    picks the row's source), by content (``env.reset_from_observation(task["observation"])``) where the row has
    an ``observation`` and the env can start from one, else ``env.reset(task_id, seed)``."""
    whole = getattr(env, "start_task", None)
    if callable(whole):
        return whole(task)
    observation = task.get("observation")
    if observation and callable(getattr(env, "reset_from_observation", None)):
        return env.reset_from_observation(str(observation))
    return env.reset(task_id=task.get("task_id"), seed=task.get("seed"))

