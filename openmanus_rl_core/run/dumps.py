"""Rollout dumps: what each training step trained on, as the update read it (``trainer.save_rollouts=true``).

``<run_dir>/rollouts/step_000012.parquet`` holds step 12's batch, one row per training sample (an episode, or one
turn of it with a per-turn memory). Columns:

- who: ``step``, ``row``, ``task_id``, ``task_row`` (the task row's index in the run's training task files, in
  order: ``data.train_files``, or the generated ``<run>/data/train.parquet``), ``seed`` (the task row's),
  ``data_source``, ``source`` (a mix's source), ``role`` (the trajectory's
  ``info["role"]``: a game's seat), ``group_id``, ``episode_id``,
  ``uid`` (the sample), ``sample`` (its index within its group), ``turn`` (the sample's first turn: one turn with
  a per-turn memory, a segment's first with an agent's segments; -1: the whole episode);
- the tokens and every tensor the update read, each row as wide as the batch: ``input_ids``, ``attention_mask``,
  ``position_ids``, ``responses``, ``response_mask``, ``rollout_log_probs`` (the behaviour policy's, from the
  engine), ``old_log_probs`` and ``ref_log_probs`` (where the step had them), ``token_level_scores``,
  ``token_level_rewards``, ``advantages``, ``returns``, ``values`` (with a critic), ``versions`` (the policy version
  that generated each response token; -1 on observation tokens), ``choice_ids`` and ``forced`` (where a
  constraint decoded the replies: the tokens it allowed at each position, ``[B, R, K]`` stored as a row of R * K
  values, and 1 where it allowed one), ``ref_choice_log_probs`` (with ``algorithm.choice_kl_coeff``: the
  reference's log-probabilities of those tokens, laid out as ``choice_ids``), ``choice_values`` (with
  ``algorithm.all_action_coeff``: each allowed token's value from the value table, laid out the same);
- how it went: ``reward``, ``reward_parts`` (JSON, per component), ``termination``, ``env_error``, ``invalid`` (the
  sample's replies the template could not read), ``success``, ``valid`` (False: an env error left out of the loss).

Groups the step played and did not train go to ``dropped_000012.jsonl`` (:meth:`RolloutDumps.write`).

The file's schema metadata holds the format, the step and the model fingerprint (:func:`model_fingerprint`: the
model's config and tokenizer files), so a dump is never replayed on another model. Each file is written to a
temporary name, fsynced and renamed: a kill leaves the previous file or the whole new one. Its SHA-256 goes into
the next checkpoint's ``meta`` (``rollouts``): a checkpoint names every batch trained before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from openmanus_rl_core.atomic import write_atomic

FORMAT = 1
FOLDER = "rollouts"
_STEP_FILE = re.compile(r"^step_(\d+)\.parquet$")
_RECORD = re.compile(r"^(step|dropped)_(\d+)\.(parquet|jsonl)$")
_MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
# tensor column -> numpy dtype it is written as (and torch dtype it is read back as)
TENSORS = {"input_ids": "int64", "attention_mask": "int64", "position_ids": "int64", "responses": "int64",
           "response_mask": "float32", "rollout_log_probs": "float32", "old_log_probs": "float32",
           "ref_log_probs": "float32", "token_level_scores": "float32", "token_level_rewards": "float32",
           "advantages": "float32", "returns": "float32", "values": "float32", "versions": "int64",
           "step_ids": "int64", "valid": "bool", "forced": "float32", "choice_ids": "int64",
           "ref_choice_log_probs": "float32", "choice_values": "float32"}


class DumpError(ValueError):
    """A dump that cannot be used: unreadable, truncated, of another model, or missing; names the file."""


def dump_path(folder: str | os.PathLike, step: int) -> Path:
    return Path(folder) / f"step_{int(step):06d}.parquet"


def dumped_steps(folder: str | os.PathLike) -> list[int]:
    """The steps a dumps folder holds, in order."""
    folder = Path(folder)
    found = (_STEP_FILE.match(p.name) for p in folder.iterdir()) if folder.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m)


def model_fingerprint(model_dir: str | os.PathLike) -> str:
    """SHA-256 over the model folder's config and tokenizer files (names and bytes): equal for the same model."""
    digest = hashlib.sha256()
    for name in _MODEL_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _columns(batch: Any, step: int) -> dict[str, Any]:
    """The dump's columns of ``batch`` (module docstring)."""
    nt = batch.non_tensors
    B = len(batch)
    episodes = list(nt.get("episode_ids", nt["uid"]))
    seen: dict[Any, list] = {}
    sample = []
    for gid, ep in zip(nt["group_ids"], episodes):
        members = seen.setdefault(gid, [])
        if ep not in members:
            members.append(ep)
        sample.append(members.index(ep))
    turn = [-1] * B  # a sample of turns (per-turn memory, an agent's segment): its first turn, as step_ids hold it
    if "episode_ids" in nt:
        ids = batch["step_ids"].masked_fill(batch["step_ids"] < 0, 1 << 62)
        turn = [-1 if t == 1 << 62 else t for t in ids.min(dim=1).values.tolist()]
    cols: dict[str, Any] = {
        "step": [int(step)] * B, "row": list(range(B)), "task_id": list(nt["task_id"]),
        "task_row": [None if v is None else int(v) for v in nt.get("task_row", [None] * B)],
        "seed": [None if v is None else int(v) for v in nt.get("seed", [None] * B)],
        "data_source": [None if v is None else str(v) for v in nt.get("data_source", [None] * B)],
        "source": [None if v is None else str(v) for v in nt.get("source", [None] * B)],
        "role": [None if v is None else str(v) for v in nt.get("roles", [None] * B)],
        "group_id": [str(g) for g in nt["group_ids"]], "episode_id": [str(e) for e in episodes],
        "uid": [str(u) for u in nt["uid"]], "sample": sample, "turn": turn,
        "reward": [float(r) for r in nt["reward"]],
        "reward_parts": [json.dumps(p, sort_keys=True) for p in nt["reward_parts"]],
        "termination": list(nt["termination"]),
        "env_error": [t == "env_error" for t in nt["termination"]],
        "invalid": [int(v) for v in nt.get("invalid", [0] * B)],
        "success": [bool(s) for s in nt["success"]],
    }
    for name, dtype in TENSORS.items():
        if name in batch.tensors:
            cols[name] = batch.tensors[name].detach().cpu().numpy().astype(dtype)
    return cols


def write_dump(folder: str | os.PathLike, step: int, batch: Any, fingerprint: str) -> tuple[Path, str]:
    """Write ``batch`` as step ``step``'s dump, atomically; returns ``(path, sha256)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays, widths, shapes = {}, {}, {}
    for name, values in _columns(batch, step).items():
        if isinstance(values, np.ndarray):
            widths[name] = int(np.prod(values.shape[1:])) if values.ndim >= 2 else 0
            if values.ndim > 2:  # choice_ids [B, R, K]: a row's R * K values, its shape in the metadata
                shapes[name] = list(values.shape[1:])
            flat = pa.array(values.reshape(-1))
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat, widths[name]) if values.ndim >= 2 else flat
        else:
            arrays[name] = pa.array(values)
    meta = {"format": FORMAT, "step": int(step), "model": fingerprint, "rows": len(batch), "widths": widths,
            "shapes": shapes}
    table = pa.table(arrays).replace_schema_metadata({"openmanus_rl": json.dumps(meta)})
    path = dump_path(folder, step)
    write_atomic(path, lambda f: pq.write_table(table, f), durable=True)
    return path, _sha256(path)


def read_dump(path: str | os.PathLike, fingerprint: str | None = None) -> Any:
    """Step ``N``'s dump as the :class:`~openmanus_rl_core.batch.Batch` the update read (tensors and the per-sample
    columns); raises :class:`DumpError` naming the file when it is unreadable or another model's."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from openmanus_rl_core.batch import Batch

    path = Path(path)
    if not path.is_file():
        raise DumpError(f"{path}: no such rollout dump")
    try:
        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {}).get(b"openmanus_rl", b"null"))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DumpError(f"{path}: not a readable rollout dump ({type(exc).__name__}: {str(exc).splitlines()[0]})") \
            from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or table.num_rows != meta.get("rows"):
        raise DumpError(f"{path}: not a rollout dump of format {FORMAT} (written by trainer.save_rollouts)")
    if fingerprint is not None and meta["model"] != fingerprint:
        raise DumpError(f"{path}: written for another model or tokenizer (fingerprint {meta['model'][:12]}, this "
                        f"model's {fingerprint[:12]}); replay it on the run's own checkpoint")
    tensors = {}
    for name, width in meta["widths"].items():
        column = table.column(name).combine_chunks()
        values = (column.flatten() if width else column).to_numpy(zero_copy_only=False)
        shape = (table.num_rows, *meta.get("shapes", {}).get(name, [-1])) if width else values.shape
        tensors[name] = torch.from_numpy(np.ascontiguousarray(values.reshape(shape)).astype(TENSORS[name]))
    keep = ("task_id", "task_row", "seed", "data_source", "source", "group_id", "episode_id", "uid", "reward",
            "termination", "success")
    non_tensors = {name: table.column(name).to_pylist() for name in keep if name in table.column_names}
    non_tensors["reward_parts"] = [json.loads(p) for p in table.column("reward_parts").to_pylist()]
    return Batch(tensors=tensors, non_tensors=non_tensors, meta={"step": int(meta["step"])})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class RolloutDumps:
    """The run's dumps: each step's written as it trains (:meth:`write`), their hashes for the next checkpoint."""

    def __init__(self, run_dir: str | os.PathLike, model_dir: str | os.PathLike):
        self.folder = Path(run_dir) / FOLDER
        self.fingerprint = model_fingerprint(model_dir)
        self.written: dict[str, str] = {}  # file name -> sha256, every step up to the newest

    def write(self, step: int, batch: Any, dropped: Sequence[Mapping[str, Any]] = ()) -> None:
        """Step ``step``'s batch, and the groups it played and left out (``dropped_000012.jsonl``, one JSON object
        per group: task_id, task_row, seed, source, group_id, samples, reason -- no_spread, surplus or stale --
        none: no file)."""
        path, sha = write_dump(self.folder, step, batch, self.fingerprint)
        self.written[path.name] = sha
        left_out = self.folder / f"dropped_{int(step):06d}.jsonl"
        if dropped:
            write_atomic(left_out, "".join(json.dumps(dict(d), sort_keys=True) + "\n" for d in dropped))
            self.written[left_out.name] = _sha256(left_out)
        elif left_out.exists():  # a killed run's attempt at this step left some out; this one did not
            left_out.unlink()
            self.written.pop(left_out.name, None)

    def manifest(self, step: int) -> dict[str, str]:
        """The dumps and dropped files of steps up to ``step``, as a checkpoint lists them (a resumed run hashes
        those on disk once)."""
        for path in sorted(self.folder.iterdir()) if self.folder.is_dir() else ():
            found = _RECORD.match(path.name)
            if found and int(found.group(2)) <= step and path.name not in self.written:
                self.written[path.name] = _sha256(path)
        return {name: sha for name, sha in sorted(self.written.items()) if int(_RECORD.match(name).group(2)) <= step}
