"""ScienceWorld's tasks and their train/dev/test variations, and our task ids over them.

``variations.json`` lists, for each of the 30 tasks (in the package's task-id order, ``1-1`` ... ``10-2``), the
variation indices of ScienceWorld's own train, dev and test splits, as the installed jar reports them. Regenerate it
with ``python -m openmanus_rl_env_sciworld.tasks`` after changing the ``scienceworld`` version.

Task ids: all train variations first, then all dev variations, then all test variations. Within a split the
variations are interleaved over the tasks (task 1's first variation, task 2's first, ..., then every task's
second, ...), so any prefix of a split covers every task.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from scienceworld.constants import ID2TASK
from scienceworld.utils import infer_task

TABLE = Path(__file__).parent / "variations.json"
SPLITS = ("train", "dev", "test")


@lru_cache(maxsize=None)
def table() -> dict[str, dict]:
    """``{task name: {"id": "1-1", "train": [...], "dev": [...], "test": [...]}}`` in task-id order."""
    return json.loads(TABLE.read_text())


def select(tasks: Sequence[str] | None) -> list[str]:
    """Task names for ``tasks`` (names or ids like ``"4-1"``; None: all 30), in task-id order."""
    names = list(table())
    if tasks is None:
        return names
    by_id = {v["id"]: k for k, v in table().items()}
    wanted = []
    for t in tasks:
        name = by_id.get(str(t), infer_task(str(t)))
        if name not in table():
            raise ValueError(f"task {t!r} is not a ScienceWorld task; known ids: {', '.join(by_id)}")
        wanted.append(name)
    return [n for n in names if n in wanted]


def layout(names: Sequence[str]) -> tuple[list[tuple[str, int, str]], dict[str, int]]:
    """``([(task name, variation, split), ...] in task-id order, {split: count})``."""
    rows: list[tuple[str, int, str]] = []
    counts = {}
    for split in SPLITS:
        lists = [(n, table()[n][split]) for n in names]
        longest = max((len(v) for _, v in lists), default=0)
        before = len(rows)
        for k in range(longest):
            rows.extend((n, v[k], split) for n, v in lists if k < len(v))
        counts[split] = len(rows) - before
    return rows, counts


def build_table() -> dict[str, dict]:
    """Ask the jar for every task's split variations (about 15 s)."""
    from openmanus_rl_env_sciworld.jvm import POOL

    jvm, server = POOL.acquire(1, "1g")
    try:
        out = {}
        for task_id, raw in ID2TASK.items():
            name = infer_task(raw)
            server.load(name, 0, "", False)
            out[name] = {"id": task_id, "train": list(server.getVariationsTrain()),
                         "dev": list(server.getVariationsDev()), "test": list(server.getVariationsTest())}
        return out
    finally:
        POOL.release(jvm, server)


if __name__ == "__main__":
    rows = [f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in build_table().items()]
    TABLE.write_text("{\n" + ",\n".join(rows) + "\n}\n")
    print(f"wrote {TABLE}")
