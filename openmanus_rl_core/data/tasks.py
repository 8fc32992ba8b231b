"""Task files (parquet): reading, checking and writing them (the commands `data make` and `data verify` are in
commands/data.py; the sampler is data/sampler.py, generated task files data/generation.py).

A task file is a parquet table, one row per task. Columns:

================  ========  =========  ==============================================================
column            type      needed     meaning
================  ========  =========  ==============================================================
``env``           string    optional   the env's registry name (the trainer uses ``cfg.env.name``)
``task_id``       int64     required   passed to ``Env.reset(task_id=...)``
``seed``          int64     required   passed to ``Env.reset(seed=...)``
``split``         string    optional   ``train`` or ``val``
``prompt``        string    optional   a fixed prompt (or a chat list of ``{role, content}``)
``ground_truth``  string    optional   for reward components that compare against a reference
``data_source``   string    optional   where the task came from (reported in metrics)
``source``        string    optional   its source in a mix of envs (``env=mix``): drawn by ratio, with its metrics
``extra``         string    optional   a JSON document; parsed into ``task["extra"]``
================  ========  =========  ==============================================================

Any integer type is accepted for ``task_id``/``seed``, and a float column whose values are all
whole numbers (what pandas writes for an int column with gaps); a null in a required column is an
error (in an optional one it reads as ``None``: ``Env.reset`` then picks). The verl layout,
where ``reward_model`` is a struct with a ``ground_truth`` field (and ``extra_info`` a struct), is
read too: ``ground_truth`` is taken from the struct, ``extra_info`` becomes ``extra``.
Columns not listed above pass through unchanged.

Every task dict has all documented keys (absent optional ones are ``None``, ``extra`` is ``{}``).

OpenManus-RL's published layout is read too, detected by its columns (``data_source, item_id, conversations,
prompt, ability, reward_model, extra_info``); see :func:`openmanus_rl_core.data.openmanus_layout.read_openmanus`. Its rows
become tasks with a demonstration (for the warm-up and ``openmanus-rl data verify``), the task's first observation
(a task by content) and the ground truth.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from openmanus_rl_core.atomic import write_atomic
from openmanus_rl_core.data.columns import COLUMNS, DataError
from openmanus_rl_core.data.openmanus_layout import OPENMANUS_COLUMNS, read_openmanus

__all__ = ["DataError", "COLUMNS", "load_tasks", "require_tasks", "write_tasks"]


_INT_COLUMNS = ("task_id", "seed")
_STR_COLUMNS = ("env", "split", "ground_truth", "data_source", "source")


# ------------------------------------------------------------------------------------------ reading
def load_tasks(path: str | os.PathLike | Sequence[str | os.PathLike], required: Iterable[str] = ("task_id", "seed")) -> list[dict]:
    """Read tasks from one parquet file (or several, concatenated in order).

    Raises :class:`DataError` naming the file, the column, the expected type and, for a bad value,
    the 0-based row index within that file.
    """
    if isinstance(path, (list, tuple)):
        tasks: list[dict] = []
        for p in path:
            tasks.extend(load_tasks(p, required))
        return tasks
    path = Path(os.fspath(path)).expanduser()
    if not (path.is_file() or path.is_dir()):  # a folder: a partitioned parquet data set, read as one table
        raise DataError(f"{path}: no such task file; write one with `openmanus-rl data make env=<name>` "
                        f"or point data.train_files/data.val_files at an existing parquet file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from exc

    names = table.column_names
    if set(OPENMANUS_COLUMNS) <= set(names):
        return read_openmanus(path, table)
    columns: dict[str, list] = {}
    for col in required:
        if col not in names and not (col == "ground_truth" and _struct_ground_truth(path, table) is not None):
            expected = COLUMNS.get(col, ("a value",))[0]
            raise DataError(f"{path}: missing column {col!r} (expected {expected}); the file has columns {names}")
    for col in _INT_COLUMNS:
        if col in names:
            columns[col] = _int_column(path, col, table.column(col), required=col in required)
    for col in _STR_COLUMNS:
        if col in names:
            columns[col] = _str_column(path, col, table.column(col), required=col in required)
    if "ground_truth" not in names:
        gt = _struct_ground_truth(path, table)
        if gt is not None:
            columns["ground_truth"] = [v if v is None or isinstance(v, str) else json.dumps(v) for v in gt]
    if "prompt" in names:
        columns["prompt"] = _prompt_column(path, table.column("prompt"), required="prompt" in required)
    if "extra" in names:
        columns["extra"] = _extra_column(path, table.column("extra"))
    elif "extra_info" in names and pa.types.is_struct(table.schema.field("extra_info").type):
        columns["extra"] = [v or {} for v in _pylist(path, "extra_info", table.column("extra_info"))]
    passthrough = [c for c in names if c not in columns and c not in COLUMNS]

    n = table.num_rows
    tasks = []
    for i in range(n):
        task: dict[str, Any] = {c: None for c in COLUMNS}
        task["extra"] = {}
        for c, values in columns.items():
            task[c] = values[i]
        tasks.append(task)
    for c in passthrough:
        for task, v in zip(tasks, _pylist(path, c, table.column(c))):
            task[c] = v
    return tasks


def require_tasks(tasks: list[dict], files: Any, why: str) -> list[dict]:
    """``tasks``, or a DataError naming ``files`` when they hold none; ``why`` says what needs them and how to opt out."""
    if not tasks:
        raise DataError(f"{files}: no tasks (0 rows), but {why}")
    return tasks


def _first_null(col: pa.ChunkedArray) -> int | None:
    if col.null_count == 0:
        return None
    return next(i for i, null in enumerate(col.is_null().to_pylist()) if null)


def _pylist(path: Path, name: str, col: pa.ChunkedArray) -> list:
    """``col.to_pylist()``; text that is not UTF-8 (a damaged string page) is a DataError naming the row."""
    try:
        return col.to_pylist()
    except UnicodeDecodeError as exc:
        row = next((i for i in range(len(col)) if not _decodes(col, i)), "?")
        raise DataError(f"{path}: column {name!r} row {row}: text that is not valid UTF-8 ({exc.reason}); the "
                        f"file is damaged or was written in another encoding") from None


def _decodes(col: pa.ChunkedArray, i: int) -> bool:
    try:
        col[i].as_py()
    except UnicodeDecodeError:
        return False
    return True


def _int_column(path: Path, name: str, col: pa.ChunkedArray, required: bool) -> list[int | None]:
    t = col.type
    if pa.types.is_null(t) and not required:
        return [None] * len(col)
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise DataError(f"{path}: column {name!r} has type {t}, expected int64")
    values = col.to_pylist()
    for i, v in enumerate(values):
        if v is None:
            if required:
                raise DataError(f"{path}: column {name!r} row {i}: null value, expected int64")
        elif isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
            raise DataError(f"{path}: column {name!r} row {i}: {v!r} is not an integer, expected int64")
        elif not -(2**63) <= v < 2**63:
            raise DataError(f"{path}: column {name!r} row {i}: {v} does not fit in int64")
    return [None if v is None else int(v) for v in values]


def _str_column(path: Path, name: str, col: pa.ChunkedArray, required: bool) -> list[str | None]:
    t = col.type
    if pa.types.is_null(t) and not required:  # an all-null optional column carries no type
        return [None] * len(col)
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
        raise DataError(f"{path}: column {name!r} has type {t}, expected string")
    if required:
        row = _first_null(col)
        if row is not None:
            raise DataError(f"{path}: column {name!r} row {row}: null value, expected string")
    return _pylist(path, name, col)


def _prompt_column(path: Path, col: pa.ChunkedArray, required: bool) -> list:
    t = col.type
    chat = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type) and {
        "role", "content"} <= {t.value_type.field(i).name for i in range(t.value_type.num_fields)}
    if chat:  # the verl layout: a list of chat messages
        values = _pylist(path, "prompt", col)
        if required and (row := _first_null(col)) is not None:
            raise DataError(f"{path}: column 'prompt' row {row}: null value, expected string or chat list")
        return values
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or (pa.types.is_null(t) and not required)):
        raise DataError(f"{path}: column 'prompt' has type {t}, expected string "
                        f"(or a list of {{role, content}} chat messages)")
    return _str_column(path, "prompt", col, required)


def _extra_column(path: Path, col: pa.ChunkedArray) -> list:
    t = col.type
    if pa.types.is_struct(t):
        return [v or {} for v in _pylist(path, "extra", col)]
    values = _str_column(path, "extra", col, required=False)
    out = []
    for i, v in enumerate(values):
        if v is None or v == "":
            out.append({})
            continue
        try:
            out.append(json.loads(v))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: column 'extra' row {i}: not valid JSON ({exc.msg} at char {exc.pos}), "
                            f"expected a JSON string") from None
    return out


def _struct_ground_truth(path: Path, table: pa.Table) -> list | None:
    """``reward_model.ground_truth`` of the verl layout, or None when the file has no such struct."""
    if "reward_model" not in table.column_names:
        return None
    t = table.schema.field("reward_model").type
    if not pa.types.is_struct(t) or t.get_field_index("ground_truth") < 0:
        return None
    rows = _pylist(path, "reward_model", table.column("reward_model"))
    return [None if r is None else r.get("ground_truth") for r in rows]


# ------------------------------------------------------------------------------------------ writing
def _same(v: Any) -> Any:
    return v


# How a column's python values are stored: ``extra`` holds JSON text.
_ENCODE = {"extra": lambda v: None if v is None or isinstance(v, str) else json.dumps(v)}


def write_tasks(path: str | os.PathLike, tasks: Sequence[dict]) -> Path:
    """Write ``tasks`` to ``path`` atomically (a temporary file in the same folder, fsync, rename).

    Documented columns get their documented types (``extra`` dicts become JSON text); other keys
    are written with the type pyarrow infers. Returns the path.
    """
    path = Path(os.fspath(path)).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for t in tasks:
        keys.extend(k for k in t if k not in keys)
    arrays, fields = [], []
    for k in keys:
        values = [_ENCODE.get(k, _same)(t.get(k)) for t in tasks]
        if k in COLUMNS:
            if all(v is None for v in values) and k not in _INT_COLUMNS:
                continue  # an all-None optional column says nothing; leave it out
            typ = COLUMNS[k][1]
            try:
                arr = pa.array(values, type=typ)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                bad = next((i for i, v in enumerate(values) if not _fits(v, typ)), None)
                raise DataError(f"{path}: cannot write column {k!r} as {COLUMNS[k][0]}"
                                + (f": task {bad} has {values[bad]!r}" if bad is not None else f": {exc}")) from exc
        else:
            arr = pa.array(values)
        arrays.append(arr)
        fields.append(pa.field(k, arr.type))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    write_atomic(path, lambda f: pq.write_table(table, f), durable=True)
    from openmanus_rl_core.checkpoint.store import fsync_dir  # the checkpoint module owns durability; imported late (torch)

    fsync_dir(path.parent)
    return path


def _fits(v: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([v], type=typ)
        return True
    except (pa.ArrowException, TypeError, ValueError):
        return False
