"""Task files generated for an env: train and val rows of (task_id, seed), with the columns the env contributes,
written by ``openmanus-rl data make`` and by a run whose ``data.train_files`` / ``data.val_files`` are null."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from openmanus_rl_core.data.tasks import DataError, write_tasks

__all__ = ["generate_tasks", "split_rows", "write_split_files", "ensure_task_files"]


def _split_seed(data_seed: int, split: str, index: int) -> int:
    """A 31-bit seed, fixed by (data seed, split, row index): train and val rows never share one stream."""
    code = {"train": 0, "val": 1}.get(split, 2)
    return int(np.random.SeedSequence([int(data_seed), code, int(index)]).generate_state(1)[0]) & 0x7FFFFFFF


def generate_tasks(env: str, train_tasks: int, val_tasks: int, seed: int = 0,
                   num_tasks: int | None = None) -> tuple[list[dict], list[dict]]:
    """Train and val task lists for ``env``.

    Train row ``i`` has ``task_id = i`` (``i % num_tasks`` when the env has fewer tasks than rows).
    Val rows take the next ids, ``train_tasks .. train_tasks + val_tasks - 1``, when those exist
    (``num_tasks`` unknown or large enough); otherwise val reuses ids ``k % num_tasks`` and differs
    from train by its seeds only. Row ``i`` of a split has seed ``_split_seed(seed, split, i)``, so
    no val row repeats a train ``(task_id, seed)`` pair.
    """
    train_tasks, val_tasks = int(train_tasks), int(val_tasks)
    if train_tasks < 1 or val_tasks < 0:
        raise DataError(f"train_tasks={train_tasks} must be >= 1 and val_tasks={val_tasks} >= 0")
    wrap = (lambda i: i % num_tasks) if num_tasks else (lambda i: i)
    disjoint = not num_tasks or train_tasks + val_tasks <= num_tasks
    val_ids = [train_tasks + k for k in range(val_tasks)] if disjoint else [wrap(k) for k in range(val_tasks)]

    def rows(ids: list[int], split: str) -> list[dict]:
        return [{"env": env, "task_id": int(t), "seed": _split_seed(seed, split, i), "split": split,
                 "data_source": env} for i, t in enumerate(ids)]

    return rows([wrap(i) for i in range(train_tasks)], "train"), rows(val_ids, "val")


def env_num_tasks(cfg: Any) -> int | None:
    """How many task ids the env has: ``env.num_tasks`` in the config, else the built env's attribute.

    Building the env can fail (an AgentGym server not running); then the count is unknown and the
    ids are not wrapped.
    """
    if cfg.env.num_tasks is not None:
        return cfg.env.num_tasks
    from openmanus_rl_core.plugin.registry import PluginLoadError, build, registry

    name = cfg.env.name
    registry("env").get(name)  # an unknown name raises here, with close matches suggested
    try:
        env = build("env", cfg.env)
    except PluginLoadError:
        raise
    except Exception as exc:  # the env's own constructor: anything may fail (a server that is not up)
        print(f"note: could not build env {name!r} to read its num_tasks ({type(exc).__name__}: {exc}); "
              f"task ids are not wrapped. Set env.num_tasks to override.")
        return None
    try:
        n = getattr(env, "num_tasks", None)
        return int(n) if isinstance(n, int) and n > 0 else None
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def add_env_task_fields(cfg: Any, *splits: list[dict]) -> None:
    """Columns an env contributes to its own task rows, merged in place.

    An env class with a ``task_fields(task_id) -> dict`` method (a dataset env: ``ground_truth``, ``data_source``,
    ``prompt``, ``extra``) gets those columns written into its task files, so reward components find them in
    ``Trajectory.task``. The generated ``task_id``/``seed``/``split``/``env`` are kept. Envs without the method are
    not built here.
    """
    from openmanus_rl_core.plugin.registry import PluginError, build, registry

    try:
        factory = registry("env").get(cfg.env.name)
    except PluginError:  # not installed / not importable here: the rows stay as generated (as before)
        return
    if not callable(getattr(factory, "task_fields", None)):
        return
    env = build("env", cfg.env)
    try:
        for rows in splits:
            for row in rows:
                fields = env.task_fields(row["task_id"]) or {}
                row.update({k: v for k, v in fields.items() if k not in ("task_id", "seed", "split", "env")})
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def split_rows(cfg: Any) -> tuple[list[dict], list[dict]]:
    """The generated train and val rows of ``cfg.env``: an env class with ``generate_splits(kwargs, seed)`` makes its
    own (a mix of envs: each source's rows), any other env gets :func:`generate_tasks` plus its task fields."""
    from openmanus_rl_core.plugin.registry import PluginError, registry

    try:
        own = getattr(registry("env").get(cfg.env.name), "generate_splits", None)
    except PluginError:  # not installed / not importable here: generated from ids alone (env_num_tasks says why)
        own = None
    if callable(own):
        return own(cfg.env.kwargs, cfg.data.seed)
    train, val = generate_tasks(cfg.env.name, cfg.env.train_tasks, cfg.env.val_tasks, cfg.data.seed,
                                env_num_tasks(cfg))
    add_env_task_fields(cfg, train, val)
    return train, val


def write_split_files(cfg: Any, out_dir: Path, which: Sequence[str] = ("train", "val")) -> dict[str, Path]:
    train, val = split_rows(cfg)
    out = {}
    for split, tasks in (("train", train), ("val", val)):
        if split in which:
            out[split] = write_tasks(Path(out_dir) / f"{split}.parquet", tasks)
    return out


def ensure_task_files(cfg: Any, out_dir: str | os.PathLike) -> tuple[Any, Any]:
    """``(train_files, val_files)`` for a run: the configured ones, or files generated into ``out_dir``.

    ``data.train_files`` / ``data.val_files`` left null are generated (as ``openmanus-rl data make``
    would) into ``out_dir/train.parquet`` / ``out_dir/val.parquet``; set ones are returned as given
    (a path or a list of paths) after checking that they exist.
    """
    given = {"train": cfg.data.train_files, "val": cfg.data.val_files}
    for split, files in given.items():
        if files is not None:
            for f in ([files] if isinstance(files, (str, os.PathLike)) else list(files)):
                if not Path(os.fspath(f)).expanduser().is_file():
                    raise DataError(f"data.{split}_files: {f}: no such file; write task files with "
                                    f"`openmanus-rl data make env=<name> data.dir=<folder>` or set data.{split}_files=null "
                                    f"to generate them into the run directory")
    missing = [s for s, f in given.items() if f is None]
    made = write_split_files(cfg, Path(out_dir), missing) if missing else {}

    def norm(x: Any) -> Any:
        return str(x) if isinstance(x, (str, os.PathLike)) else [str(p) for p in x]

    return (norm(given["train"] if given["train"] is not None else made["train"]),
            norm(given["val"] if given["val"] is not None else made["val"]))
