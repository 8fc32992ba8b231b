"""``openmanus-rl data make`` (task files for an env) and ``openmanus-rl data verify`` (replay a data set's
demonstrations through the env)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pyarrow.parquet as pq

from openmanus_rl_core.data import DataError, load_tasks, write_split_files


def make(cfg: Any) -> int:
    """``openmanus-rl data make env=<name>``: write ``train.parquet`` and ``val.parquet`` into ``data.dir``."""
    paths = write_split_files(cfg, Path(cfg.data.dir).expanduser())
    for split, p in paths.items():
        n = pq.read_metadata(p).num_rows
        print(f"{split}: {p} ({n} tasks)")
    return 0


def verify(cfg: Any) -> int:
    """``openmanus-rl data verify env=<name> data.val_files=<file>``: replay each row's demonstration in the env.

    Each row's task is started as the rollout starts it (by content where the row and the env allow), then the
    demonstration's actions are sent in order. A row passes when the env reports success (``info["success"]``, or
    ``done`` for an env that reports no success) by the end of its actions. Prints the success rate and every
    failing row (index, ``item_id``, why); exits 1 when any row fails (a row without a demonstration fails too),
    so a script can stop on a dataset that does not agree with the env version.
    """
    from openmanus_rl_core.envs import open_env_service
    from openmanus_rl_core.registry import registry
    from openmanus_rl_core.rollout import start_task

    files = cfg.data.val_files
    if not files:
        raise DataError("data verify needs data.val_files=<parquet file> (a file with demonstrations, e.g. "
                        "OpenManus-RL's layout)")
    tasks = load_tasks(files)
    name = cfg.env.name
    factory = registry("env").get(name)
    service = open_env_service(name, factory, cfg.env.kwargs)
    failures: list[str] = []
    try:
        for i, task in enumerate(tasks):
            why = _replay(factory, service.kwargs, task, start_task)
            if why:
                failures.append(f"  row {i} ({task.get('item_id') or task.get('task_id')}): {why}")
    finally:
        service.close()
    n = len(tasks)
    print(f"{name}: {n - len(failures)}/{n} demonstrations succeed (success rate "
          f"{(n - len(failures)) / n if n else float('nan'):.3f}) in {files}")
    if failures:
        print(f"failing rows ({len(failures)}):")
        print("\n".join(failures))
    return 1 if failures else 0


def _replay(factory: Any, kwargs: Mapping[str, Any], task: Mapping[str, Any], start_task: Any) -> str | None:
    """Why the row's demonstration does not succeed in the env, or None when it does."""
    demo = task.get("demonstration")
    if not demo or not demo.get("steps"):
        return "no demonstration"
    env = factory(**kwargs)
    try:
        start_task(env, task)
        for k, (action, _) in enumerate(demo["steps"]):
            res = env.step(action)
            success = res.info.get("success") if isinstance(res.info, Mapping) else None
            if success or (success is None and res.done):
                return None
            if res.done:
                return f"the episode ended at action {k + 1} ({action!r}) without success: {res.observation[:120]!r}"
        return f"no success after all {len(demo['steps'])} actions; last observation {res.observation[:120]!r}"
    except Exception as exc:  # an env error is this row's failure, not the end of the check
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        env.close()
