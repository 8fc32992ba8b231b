"""Task files (parquet) and the task sampler (the commands `data make` and `data verify` are in commands/data.py).

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
prompt, ability, reward_model, extra_info``); see :func:`read_openmanus`. Its rows become tasks with a
demonstration (for the warm-up and ``openmanus-rl data verify``), the task's first observation (a task by content)
and the ground truth.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


__all__ = [
    "DataError",
    "COLUMNS",
    "load_tasks",
    "require_tasks",
    "write_tasks",
    "TaskSampler",
    "generate_tasks",
    "ensure_task_files",
    "OPENMANUS_COLUMNS",
    "OPENMANUS_SCHEMA",
    "read_openmanus",
    "conversation_demonstration",
]


class DataError(ValueError):
    """A task file that cannot be used: names the file, the column, the expected type and the row."""


# column -> (expected type as the error message names it, arrow type written by write_tasks)
COLUMNS: dict[str, tuple[str, pa.DataType]] = {
    "env": ("string", pa.string()),
    "task_id": ("int64", pa.int64()),
    "seed": ("int64", pa.int64()),
    "split": ("string", pa.string()),
    "prompt": ("string", pa.string()),
    "ground_truth": ("string", pa.string()),
    "data_source": ("string", pa.string()),
    "extra": ("string (JSON)", pa.string()),
}
_INT_COLUMNS = ("task_id", "seed")
_STR_COLUMNS = ("env", "split", "ground_truth", "data_source")


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


# ----------------------------------------------------------------------------- OpenManus-RL's layout
OPENMANUS_COLUMNS = ("data_source", "item_id", "conversations", "prompt", "ability", "reward_model", "extra_info")
# Their arrow types in OpenManus-RL's published files (what a writer of such a file uses).
OPENMANUS_SCHEMA = pa.schema([
    ("data_source", pa.string()), ("item_id", pa.string()),
    ("conversations", pa.list_(pa.struct([("from", pa.string()), ("loss", pa.bool_()), ("value", pa.string())]))),
    ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
    ("extra_info", pa.struct([("conversations", pa.string()), ("index", pa.int64()), ("split", pa.string())])),
])


def conversation_demonstration(turns: Sequence[Mapping[str, Any]]) -> dict | None:
    """An AgentGym conversation as a demonstration: ``{"observation": str, "steps": [[action, observation], ...]}``.

    ``turns``: ``{"from": "human"|"gpt", "loss": bool|None, "value": str}``. The turns to learn (``loss`` true) are
    the agent's; each one's action is the first line after its last ``Action:``, its observation the human turn
    after it ("" after the last). The first observation is the human turn before the first agent turn (the turns
    before it are AgentGym's instruction and the model's acknowledgement). None without an agent turn.
    """
    agent = [i for i, t in enumerate(turns) if t.get("from") == "gpt" and t.get("loss")]
    if not agent or agent[0] == 0 or turns[agent[0] - 1].get("from") != "human":
        return None
    steps = []
    for i in agent:
        reply = str(turns[i].get("value") or "")
        tail = reply.rpartition("Action:")[2] if "Action:" in reply else reply
        action = next((line.strip() for line in tail.splitlines() if line.strip()), "")
        after = turns[i + 1] if i + 1 < len(turns) and turns[i + 1].get("from") == "human" else None
        steps.append([action, str(after.get("value") or "") if after else ""])
    return {"observation": str(turns[agent[0] - 1].get("value") or ""), "steps": steps}


def read_openmanus(path: Path, table: pa.Table) -> list[dict]:
    """Tasks from a file in OpenManus-RL's layout (one row per AgentGym item).

    Per row: ``task_id`` is the index in ``item_id`` (``"textcraft_31"`` -> 31, AgentGym's ``data_idx``), ``seed``
    0; ``observation`` is the first observation of the conversation, so an env that can start a task from it
    (``reset_from_observation``) plays that very task whatever its index means on this machine; ``demonstration``
    is the conversation as :func:`conversation_demonstration` reads it; ``ground_truth`` is
    ``reward_model.ground_truth``; ``extra`` is ``extra_info`` (without its copy of the conversation); ``prompt``,
    ``ability`` and ``item_id`` pass through. Columns ``task_id``, ``seed`` and ``demonstration`` (``{observation,
    steps}``), when the file has them besides the layout, are used as they are.
    """
    # Our own columns, when a file carries them next to the layout (``data from-rollouts`` writes them), win over
    # what the layout implies: the exact task (task_id, seed) and the demonstration's actions as the env takes them.
    ours = [c for c in ("task_id", "seed", "demonstration") if c in table.column_names]
    rows = table.select(list(OPENMANUS_COLUMNS) + ours).to_pylist()
    tasks = []
    for i, row in enumerate(rows):
        item = str(row["item_id"] or "")
        index = item.rpartition("_")[2]
        if not index.isdigit():
            raise DataError(f"{path}: column 'item_id' row {i}: {item!r} does not end in _<index> "
                            f"(expected e.g. 'textcraft_31')")
        turns = row["conversations"] or []
        if not isinstance(turns, list) or not all(isinstance(t, Mapping) for t in turns):
            raise DataError(f"{path}: column 'conversations' row {i}: expected a list of {{from, loss, value}}, "
                            f"got {type(turns).__name__}")
        demo = row["demonstration"] if row.get("demonstration") else conversation_demonstration(turns)
        extra = {k: v for k, v in (row["extra_info"] or {}).items() if k != "conversations"}
        task: dict[str, Any] = {c: None for c in COLUMNS}
        task.update(
            task_id=int(index) if row.get("task_id") is None else int(row["task_id"]),
            seed=0 if row.get("seed") is None else int(row["seed"]), data_source=row["data_source"], prompt=row["prompt"],
            ground_truth=(row["reward_model"] or {}).get("ground_truth"), extra=extra, split=extra.get("split"),
            item_id=item, ability=row["ability"], demonstration=demo,
            observation=demo["observation"] if demo else None,
        )
        tasks.append(task)
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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    from openmanus_rl_core.checkpoint import fsync_dir  # the checkpoint module owns durability; imported late (torch)

    fsync_dir(path.parent)
    return path


def _fits(v: Any, typ: pa.DataType) -> bool:
    try:
        pa.array([v], type=typ)
        return True
    except (pa.ArrowException, TypeError, ValueError):
        return False



# ------------------------------------------------------------------------------------------ sampler
class TaskSampler:
    """Deterministic batches of tasks, epoch after epoch.

    Epoch ``e`` visits the tasks in the order ``numpy.random.default_rng([seed, e]).permutation(n)``
    (or in file order when ``shuffle=False``). A batch that runs past the end of an epoch is filled
    from the start of the next one, so every batch has exactly ``batch_size`` tasks even when
    ``batch_size`` does not divide (or exceeds) the number of tasks. The order depends on nothing but
    ``seed``, so ``load_state_dict(state_dict())`` continues with exactly the batches the
    uninterrupted sampler would have produced. Batches are shallow copies of the task dicts.
    """

    def __init__(self, tasks: Sequence[dict], batch_size: int, seed: int = 0, shuffle: bool = True):
        if len(tasks) == 0:
            raise DataError("TaskSampler got no tasks; check data.train_files / data.val_files")
        if int(batch_size) < 1:
            raise DataError(f"batch_size={batch_size!r} must be >= 1")
        self.tasks = list(tasks)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.position = 0  # index into the current epoch's order of the next task to hand out
        self._order_epoch: int | None = None
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        """Batches per epoch (rounded up)."""
        return -(-len(self.tasks) // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The task indices of ``epoch``, in visiting order."""
        if self._order_epoch != epoch:
            n = len(self.tasks)
            self._order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order  # type: ignore[return-value]

    def next_batch(self, size: int | None = None) -> list[dict]:
        """The next ``size`` rows (the batch size when None), across epochs."""
        size = self.batch_size if size is None else int(size)
        batch: list[dict] = []
        while len(batch) < size:
            order = self.order(self.epoch)
            take = min(size - len(batch), len(order) - self.position)
            batch.extend(dict(self.tasks[i]) for i in order[self.position:self.position + take])
            self.position += take
            if self.position >= len(order):
                self.epoch += 1
                self.position = 0
        return batch

    def __iter__(self) -> Iterator[list[dict]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        """Plain ints and bools (safe for ``torch.load(weights_only=True)`` and JSON)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; the task list, seed and shuffle flag must be the ones it was saved with."""
        if int(state["num_tasks"]) != len(self.tasks):
            raise DataError(f"sampler state was saved with {state['num_tasks']} tasks but this run has "
                            f"{len(self.tasks)}; resume with the same task files (data.train_files) as the saved run")
        for key, mine in (("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and type(mine)(state[key]) != mine:
                raise DataError(f"sampler state was saved with {key}={state[key]!r} but this run has {key}={mine!r}; "
                                f"resume with the same data settings, or start a fresh run directory")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < len(self.tasks):
            raise DataError(f"sampler state epoch={epoch}, position={position} is out of range for {len(self.tasks)} tasks")
        self.epoch, self.position = epoch, position


# ------------------------------------------------------------------------------------ generation
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




def _env_num_tasks(cfg: Any) -> int | None:
    """How many task ids the env has: ``env.num_tasks`` in the config, else the built env's attribute.

    Building the env can fail (an AgentGym server not running); then the count is unknown and the
    ids are not wrapped.
    """
    if cfg.env.num_tasks is not None:
        return cfg.env.num_tasks
    from openmanus_rl_core.registry import PluginLoadError, build, registry

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


def _add_env_task_fields(cfg: Any, *splits: list[dict]) -> None:
    """Columns an env contributes to its own task rows, merged in place.

    An env class with a ``task_fields(task_id) -> dict`` method (a dataset env: ``ground_truth``, ``data_source``,
    ``prompt``, ``extra``) gets those columns written into its task files, so reward components find them in
    ``Trajectory.task``. The generated ``task_id``/``seed``/``split``/``env`` are kept. Envs without the method are
    not built here.
    """
    from openmanus_rl_core.registry import PluginError, build, registry

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


def write_split_files(cfg: Any, out_dir: Path, which: Sequence[str] = ("train", "val")) -> dict[str, Path]:
    train, val = generate_tasks(cfg.env.name, cfg.env.train_tasks, cfg.env.val_tasks, cfg.data.seed,
                                _env_num_tasks(cfg))
    _add_env_task_fields(cfg, train, val)
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
