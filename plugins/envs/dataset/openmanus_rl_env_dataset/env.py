"""``dataset``: one prompt, one reply, scored by whichever reward components the config selects.

Each row of a parquet file (or of an in-memory list) is a task. Columns (the common verl layout is read as is):

============================  ============================  =====================================================
column                        type                          meaning
============================  ============================  =====================================================
``prompt``                    string, or a chat list of     what the model is asked; a chat list's ``system``
                              ``{role, content}``           messages become the env's ``instruction`` for that row,
                                                            its other messages the first observation
``ground_truth``              string                        the reference answer ...
``reward_model.ground_truth`` (struct field)                ... or here (verl); one of the two is required unless
                                                            ``require_ground_truth=False`` (a reward model scores)
``data_source``               string, optional              where the row came from (passed to scorers)
``extra_info`` / ``extra``    struct / JSON, optional       passed to scorers as ``extra``
============================  ============================  =====================================================

Task ``t`` is row ``t`` (0-based; several files are concatenated in order, so ``path: [train.parquet,
test.parquet]`` with ``train_tasks = len(train)`` and ``val_tasks = len(test)`` trains on one and validates on the
other). With neither ``path`` nor ``rows`` the env serves the built-in arithmetic set
(:func:`~openmanus_rl_env_dataset.arithmetic.arithmetic_rows`).

One turn: :meth:`DatasetEnv.reset` returns the row's prompt (never its ground truth); :meth:`DatasetEnv.step`
ends the episode with reward 0 and ``info = {"ground_truth", "data_source", "row", "success"}`` (``success``: the
answer equals a reference after normalising, for the success-rate metrics; ``success_match=None`` leaves it out).
The scoring is the reward components' job: they read ``trajectory.task["ground_truth"]``, which ``openmanus-rl data make`` (and the trainer's
generated task files) copy from this env through :meth:`DatasetEnv.task_fields`.
"""

from __future__ import annotations

import json
import numbers
import os
import random
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from openmanus_rl_core.data.tasks import DataError, load_tasks
from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_dataset.arithmetic import arithmetic_rows

__all__ = ["DatasetEnv", "DataError", "DEFAULT_INSTRUCTION"]

DEFAULT_INSTRUCTION = "Answer the question. Reply with the final answer only."


@dataclass(frozen=True)
class _Row:
    prompt: str                 # the first observation
    system: str | None          # a chat prompt's system message(s), used as the row's instruction
    ground_truth: Any
    data_source: str | None
    extra: Any
    where: str                  # "<file>: row 12" / "rows[12]": for error messages


# ---------------------------------------------------------------------------------------------- rows
def _render_prompt(prompt: Any, where: str) -> tuple[str, str | None]:
    """A prompt cell -> (first observation, system text or None). Raises DataError naming ``where``."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: column 'prompt' is empty; every row needs a prompt")
        return prompt, None
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        messages = []
        for k, m in enumerate(prompt):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise DataError(f"{where}: column 'prompt' message {k} is {m!r}; expected "
                                "{'role': str, 'content': str}")
            messages.append((m["role"], m["content"]))
        system = "\n\n".join(c for r, c in messages if r == "system") or None
        rest = [(r, c) for r, c in messages if r != "system"]
        if not rest or not any(c.strip() for _, c in rest):
            raise DataError(f"{where}: column 'prompt' has no user message; expected a chat list with at least "
                            "one {'role': 'user', 'content': ...}")
        if all(r == "user" for r, _ in rest):
            return "\n\n".join(c for _, c in rest), system
        return "\n\n".join(f"{r.capitalize()}: {c}" for r, c in rest), system
    raise DataError(f"{where}: column 'prompt' holds {type(prompt).__name__} {prompt!r}; expected a string or a "
                    "chat list of {role, content} messages")


def _ground_truth(row: Mapping[str, Any]) -> Any:
    if row.get("ground_truth") is not None:
        return row["ground_truth"]
    rm = row.get("reward_model")
    return rm.get("ground_truth") if isinstance(rm, Mapping) else None


def _make_row(raw: Mapping[str, Any], where: str, require_ground_truth: bool) -> _Row:
    if not isinstance(raw, Mapping):
        raise DataError(f"{where}: expected a mapping with a 'prompt' and a 'ground_truth', got {raw!r}")
    if raw.get("prompt") is None:
        raise DataError(f"{where}: column 'prompt' is missing or null; every row needs a prompt")
    prompt, system = _render_prompt(raw["prompt"], where)
    gt = _ground_truth(raw)
    if gt is None and require_ground_truth:
        raise DataError(f"{where}: no ground truth (column 'ground_truth' or 'reward_model.ground_truth' is missing "
                        "or null); add it, or set env.kwargs.require_ground_truth=false when no scorer needs one")
    ds = raw.get("data_source")
    if ds is not None and not isinstance(ds, str):
        raise DataError(f"{where}: column 'data_source' holds {type(ds).__name__} {ds!r}; expected a string")
    extra = raw.get("extra") if raw.get("extra") not in (None, {}) else raw.get("extra_info")
    return _Row(prompt, system, gt, ds, extra or {}, where)


def _rows_from_file(path: Path, require_ground_truth: bool) -> tuple[_Row, ...]:
    required = ("prompt", "ground_truth") if require_ground_truth else ("prompt",)
    # The core's task-file reader: the same column checks and DataError messages (file, column, type, row) as
    # task files, and the verl struct layout (reward_model.ground_truth, extra_info).
    tasks = load_tasks(path, required=required)
    if not tasks:
        raise DataError(f"{path}: the file has no rows; the dataset env needs at least one prompt")
    return tuple(_make_row(t, f"{path}: row {i}", require_ground_truth) for i, t in enumerate(tasks))


_FILE_CACHE: dict[tuple, tuple[_Row, ...]] = {}
_FILE_CACHE_MAX = 8


def _load_files(paths: Sequence[Path], require_ground_truth: bool) -> tuple[_Row, ...]:
    """Rows of all files, concatenated; cached by (path, mtime, size): the trainer builds one env per episode."""
    key_parts = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            raise DataError(f"{p}: no such dataset file; set env.kwargs.path to a parquet file with 'prompt' and "
                            "'ground_truth' columns (or write the arithmetic set with "
                            "openmanus_rl_env_dataset.make_arithmetic)") from None
        key_parts.append((str(p), st.st_mtime_ns, st.st_size))
    key = (tuple(key_parts), bool(require_ground_truth))
    rows = _FILE_CACHE.get(key)
    if rows is None:
        rows = tuple(r for p in paths for r in _rows_from_file(p, require_ground_truth))
        if len(_FILE_CACHE) >= _FILE_CACHE_MAX:
            _FILE_CACHE.pop(next(iter(_FILE_CACHE)))
        _FILE_CACHE[key] = rows
    return rows


@lru_cache(maxsize=8)
def _builtin_rows(size: int, seed: int) -> tuple[_Row, ...]:
    return tuple(_make_row(r, f"arithmetic row {i}", True) for i, r in enumerate(arithmetic_rows(size, seed)))


def _as_text(value: Any) -> str:
    """A ground truth as the text of a correct answer (numbers without a trailing .0)."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        f = float(value)
        return str(int(f)) if f.is_integer() else repr(f)
    return json.dumps(value, default=str)


_PUNCT = str.maketrans("", "", string.punctuation)


def _normalize(text: str) -> str:
    """Lowercase, no punctuation, no articles, single spaces (SQuAD's answer normalisation)."""
    text = re.sub(r"\b(a|an|the)\b", " ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


SUCCESS_MATCHES = ("exact", "normalized")


# ----------------------------------------------------------------------------------------------- env
class DatasetEnv:
    """Single-turn prompts with a ground truth (see the module docstring for the columns).

    kwargs:

    - ``path``: a parquet file, or a list of them (concatenated in order);
    - ``rows``: instead of ``path``, a list of dicts with the same keys (``prompt``, ``ground_truth`` or
      ``reward_model: {ground_truth}``, ``data_source``);
    - neither: the built-in arithmetic set of ``arithmetic_size`` rows made with ``arithmetic_seed``;
    - ``instruction``: the task description templates put in the system prompt (a row's own chat ``system``
      message replaces it for that row);
    - ``require_ground_truth`` (True): a row without a ground truth is an error naming the file and row;
    - ``success_match`` (``"normalized"``): ``info["success"]`` is True when the action equals a reference after
      SQuAD normalisation (``"exact"``: after stripping whitespace only; None: no ``success`` in info). It feeds
      the success-rate metrics and the ``goal`` reward; the env's own reward stays 0.

    Bad data raises :class:`~openmanus_rl_core.data.tasks.DataError` at construction, naming the file (or ``rows[i]``),
    the column and the row.
    """

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 rows: Sequence[Mapping[str, Any]] | None = None, instruction: str | None = None,
                 require_ground_truth: bool = True, arithmetic_size: int = 400, arithmetic_seed: int = 0,
                 success_match: str | None = "normalized"):
        if success_match is not None and success_match not in SUCCESS_MATCHES:
            raise ValueError(f"dataset env: success_match={success_match!r}; valid values are "
                             f"{list(SUCCESS_MATCHES)} or null")
        self.success_match = success_match
        if path is not None and rows is not None:
            raise ValueError("dataset env: give either path (parquet files) or rows (in-memory dicts), not both")
        if path is not None:
            paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
            if not paths:
                raise ValueError("dataset env: path is an empty list; give at least one parquet file")
            resolved = [Path(os.fspath(p)).expanduser().resolve() for p in paths]
            self.rows = _load_files(resolved, bool(require_ground_truth))
            self.source = ", ".join(str(p) for p in resolved)
        elif rows is not None:
            if isinstance(rows, (str, bytes, Mapping)):
                raise DataError(f"dataset env: rows must be a list of dicts, got {type(rows).__name__}")
            self.rows = tuple(_make_row(r, f"rows[{i}]", bool(require_ground_truth)) for i, r in enumerate(rows))
            self.source = "rows"
        else:
            if int(arithmetic_size) < 1:
                raise ValueError(f"dataset env: arithmetic_size={arithmetic_size!r} must be >= 1")
            self.rows = _builtin_rows(int(arithmetic_size), int(arithmetic_seed))
            self.source = f"the built-in arithmetic set (arithmetic_size={int(arithmetic_size)}, " \
                          f"arithmetic_seed={int(arithmetic_seed)})"
        if not self.rows:
            raise DataError(f"dataset env: {self.source} has no rows")
        self.num_tasks = len(self.rows)
        self.default_instruction = DEFAULT_INSTRUCTION if instruction is None else str(instruction)
        self.instruction = self.default_instruction
        self._index: int | None = None
        self._done = True

    # ----------------------------------------------------------------------------------- protocol
    def _row_index(self, task_id: Any, seed: int | None) -> int:
        if task_id is None:
            return random.Random(seed).randrange(self.num_tasks)
        if isinstance(task_id, bool) or not isinstance(task_id, numbers.Integral):
            raise ValueError(f"dataset env: task_id must be an int, got {type(task_id).__name__} {task_id!r}")
        if not 0 <= int(task_id) < self.num_tasks:
            raise ValueError(f"dataset env: task_id {task_id} is out of range: {self.source} has {self.num_tasks} "
                             f"rows (task ids 0..{self.num_tasks - 1}); check env.train_tasks/env.val_tasks and "
                             "the task files")
        return int(task_id)

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """The prompt of row ``task_id`` (a seeded random row when None); the ground truth stays out of it."""
        self._index = self._row_index(task_id, seed)
        row = self.rows[self._index]
        self.instruction = row.system if row.system is not None else self.default_instruction
        self._done = False
        return row.prompt

    def step(self, action: str) -> StepResult:
        """Ends the episode: reward 0 (the reward components score the reply), the ground truth in ``info`` only."""
        if self._index is None:
            raise RuntimeError("dataset env: call reset() before step()")
        row = self.rows[self._index]
        info = {"ground_truth": row.ground_truth, "data_source": row.data_source, "row": self._index}
        if self._done:  # a step after the end: answered, never raised (the protocol's step is total)
            return StepResult("The episode is over.", 0.0, True, {**info, "invalid": True})
        self._done = True
        if self.success_match is not None and row.ground_truth is not None:
            info["success"] = self._matches(action, row.ground_truth)
        return StepResult("", 0.0, True, info)

    def _matches(self, action: Any, ground_truth: Any) -> bool:
        refs = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
        norm = _normalize if self.success_match == "normalized" else str.strip
        answer = norm(action if isinstance(action, str) else str(action))
        return any(answer == norm(_as_text(r)) for r in refs)

    def close(self) -> None:
        self._done = True

    # ----------------------------------------------------------------------------------- extras
    def oracle_action(self) -> str:
        """The ground truth as text (the first reference when there are several): the supervised warm-up's answer."""
        if self._index is None:
            raise RuntimeError("dataset env: call reset() before oracle_action()")
        row = self.rows[self._index]
        gt = row.ground_truth
        if gt is None:
            raise DataError(f"{row.where}: no ground truth, so no oracle answer for the warm-up "
                            "(set warmup.enabled=false)")
        if isinstance(gt, (list, tuple)) and gt:
            gt = gt[0]
        return _as_text(gt)

    def task_fields(self, task_id: int) -> dict[str, Any]:
        """Columns for task files of this env (``openmanus-rl data make`` writes them), so reward components find
        the row's ground truth in ``trajectory.task``: ``ground_truth`` (text; JSON for a list/dict), ``data_source``,
        ``prompt`` (the first observation) and ``extra`` when the row has one."""
        row = self.rows[self._row_index(task_id, None)]
        out: dict[str, Any] = {"prompt": row.prompt}
        if row.ground_truth is not None:
            out["ground_truth"] = _as_text(row.ground_truth)
        if row.data_source is not None:
            out["data_source"] = row.data_source
        if row.extra:
            out["extra"] = row.extra
        return out
