"""Atomic checkpoints that load with ``torch.load(weights_only=True)``.

Layout of one checkpoint (``<run_dir>/checkpoints/step_000123/``)::

    <key>.pt     one file per top-level key of the saved state ("model", "optimizer", "rng", ...)
    meta.json    step, keys, time and the state's JSON-able "meta" entry, for people to read
    COMPLETE     written last: JSON manifest {"format", "step", "keys", "files": {name: {size, sha256}}}

How a save stays atomic: everything is written into ``step_000123.tmp-<random>/``, each file is
fsynced, ``COMPLETE`` is written last, the folder is fsynced and renamed to ``step_000123``, then
the parent folder is fsynced. A run killed at any moment leaves either a ``*.tmp-*`` folder (never
picked, removed by the next save) or a complete checkpoint. A write that fails (a full disk) raises
:class:`CheckpointError` naming the path and leaves the earlier checkpoints as they were.

Every load checks each file's size and SHA-256 against the manifest, whatever the path came from.
:func:`load_latest_checkpoint` (``trainer.resume=auto``) goes back from a refused checkpoint to the
previous one and raises, listing every checkpoint and why it was refused, when none loads.

Only weights_only-safe values are written: tensors (plain or ``nn.Parameter``), dicts, lists,
tuples, sets, numbers, strings, bytes, None, ``torch.dtype``/``torch.device``/``torch.Size``.
numpy scalars are converted to Python numbers; anything else (numpy arrays, DTensors, arbitrary
objects) is refused before a byte is written, with the offending key path named.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "load_latest_checkpoint",
    "open_checkpoint",
    "checkpoint_problem",
    "list_checkpoints",
    "prune_checkpoints",
]

log = logging.getLogger(__name__)

FORMAT = 1
MARKER = "COMPLETE"
META = "meta.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_LEFTOVER = re.compile(r"^step_\d+\.(tmp|old)-[0-9a-f]+$")
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the path and what to do."""


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{int(step):06d}"


# ------------------------------------------------------------------------------- safe-value check
_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _sanitize(obj: Any, where: str) -> Any:
    """``obj`` with numpy scalars made Python numbers; raises for anything weights_only cannot load."""
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise CheckpointError(
                f"{where}: a {type(obj).__module__}.{type(obj).__name__} cannot be loaded with weights_only=True; "
                f"save plain tensors (for FSDP2 use get_model_state_dict(..., options=StateDictOptions("
                f"full_state_dict=True, cpu_offload=True)) or .full_tensor())")
        return obj
    if isinstance(obj, _LEAVES):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise CheckpointError(f"{where}: dict key {k!r} of type {type(k).__name__} is not weights_only-safe; "
                                      f"use str or int keys")
            out[k] = _sanitize(v, f"{where}[{k!r}]")
        return out
    if isinstance(obj, (list, tuple, set)):
        items = [_sanitize(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return type(obj)(items) if type(obj) in (list, tuple, set) else list(items)
    if isinstance(obj, np.ndarray):
        raise CheckpointError(f"{where}: numpy array {obj.dtype}{list(obj.shape)} is not weights_only-safe; "
                              f"store torch.from_numpy(a) or a.tolist()")
    raise CheckpointError(f"{where}: {type(obj).__module__}.{type(obj).__qualname__} is not weights_only-safe "
                          f"(tensors, dicts, lists, tuples, numbers, strings only); store its state_dict() or "
                          f"convert it to those types")


# ------------------------------------------------------------------------------------------ write
class _HashingWriter:
    """File wrapper that hashes and counts what torch.save writes, so the file is not read back."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None  # torch.save reports a failed write as its own RuntimeError

    def write(self, b) -> int:
        self.sha.update(b)
        self.size += len(b)
        try:
            return self.f.write(b)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _write_file(path: Path, write) -> dict:
    """Write one file through ``write(writer)`` and fsync it; ``{"size", "sha256"}`` of what was written.

    Any failure to write (a full disk, a quota, an I/O error) raises ``OSError`` naming ``path``.
    """
    w = None
    try:
        with open(path, "wb") as f:
            w = _HashingWriter(f)
            write(w)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except RuntimeError:
        if w is None or w.error is None:
            raise
        raise OSError(w.error.errno, w.error.strerror, str(path)) from None
    return {"size": w.size, "sha256": w.sha.hexdigest()}


def fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not every filesystem allows fsync on a folder; the rename is atomic regardless
        pass
    finally:
        os.close(fd)


def _json_or_none(obj: Any) -> Any:
    try:
        return json.loads(json.dumps(obj, allow_nan=True))
    except (TypeError, ValueError):
        return None


def save_checkpoint(run_dir: str | os.PathLike, step: int, state: dict, keep_last: int | None = None) -> Path:
    """Write ``state`` as ``<run_dir>/checkpoints/step_<step:06d>/`` atomically; return that path.

    ``state``: ``{key: value}`` with keys such as ``model``, ``optimizer``, ``scheduler``, ``rng``
    (from :func:`capture_rng_state`), ``sampler``, ``step``, ``meta``; each key becomes
    ``<key>.pt``. Saving a step that already exists replaces it. ``keep_last=N`` then deletes all
    but the newest N complete checkpoints. Leftovers of interrupted saves are removed first (one
    writer per run directory is assumed: rank 0).
    """
    if not isinstance(state, dict) or not state:
        raise CheckpointError(f"state must be a non-empty dict of {{key: value}}, got {type(state).__name__}")
    for k in state:
        if not isinstance(k, str) or not _KEY.match(k) or k in (MARKER, META) or k.endswith(".pt"):
            raise CheckpointError(f"state key {k!r} cannot be a file name; use letters, digits, '_', '-', '.'")
    clean = {k: _sanitize(v, f"state[{k!r}]") for k, v in state.items()}  # refuse before writing anything

    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    name = step_dir_name(step)
    final = root / name
    tmp = root / f"{name}.tmp-{secrets.token_hex(6)}"
    tmp.mkdir()
    try:
        files: dict[str, dict] = {}
        for k, v in clean.items():
            files[f"{k}.pt"] = _write_file(tmp / f"{k}.pt", lambda f, v=v: torch.save(v, f))
        meta = {"format": FORMAT, "step": int(step), "keys": list(clean), "time": time.time(),
                "torch": torch.__version__, "meta": _json_or_none(state.get("meta"))}
        files[META] = _write_file(tmp / META, lambda f: f.write(json.dumps(meta, indent=2).encode()))
        manifest = {"format": FORMAT, "step": int(step), "keys": list(clean), "files": files}
        _write_file(tmp / MARKER, lambda f: f.write(json.dumps(manifest, indent=2).encode()))  # last
        fsync_dir(tmp)
        if final.exists():
            old = root / f"{name}.old-{secrets.token_hex(6)}"
            os.rename(final, old)
            try:
                os.rename(tmp, final)
            except OSError:
                os.rename(old, final)  # the checkpoint being replaced goes back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for _, p in list_checkpoints(run_dir)]
        raise CheckpointError(
            f"{final}: saving step {int(step)} failed writing {exc.filename or tmp}: {exc.strerror or exc} "
            f"(errno {exc.errno}); nothing of this save was kept and the earlier checkpoints "
            f"({', '.join(kept) or 'none'}) are untouched. Free space under {root} (or point trainer.run_dir "
            f"elsewhere) and resume with trainer.resume=auto") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last is not None:
        prune_checkpoints(run_dir, keep_last)
    return final


def _remove_leftovers(root: Path) -> None:
    for p in root.iterdir():
        if _LEFTOVER.match(p.name) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def step_of(path: str | os.PathLike) -> int:
    """The step of a ``step_N`` checkpoint folder."""
    m = _STEP_DIR.match(Path(path).name)
    if m is None:
        raise CheckpointError(f"{path}: not a checkpoints/step_N folder")
    return int(m.group(1))


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_N`` folder (complete or not), oldest first; tmp folders excluded."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(out)


def prune_checkpoints(run_dir: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints, and incomplete ones older than those.

    "Complete" here means the marker exists (no checksums: pruning must stay cheap). Returns the
    deleted paths.
    """
    if int(keep_last) < 1:
        raise CheckpointError(f"keep_last={keep_last!r} must be >= 1 (or None to keep every checkpoint)")
    entries = list_checkpoints(run_dir)
    complete = [(s, p) for s, p in entries if (p / MARKER).is_file()]
    kept = complete[-int(keep_last):]
    if not kept:
        return []
    kept_paths = {p for _, p in kept}
    # complete ones beyond keep_last are all older than the oldest kept one; so are the incomplete ones removed
    doomed = [p for s, p in entries if p not in kept_paths and s < kept[0][0]]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


# ------------------------------------------------------------------------------------------- read
def _read_manifest(path: Path) -> dict:
    marker = path / MARKER
    if not marker.is_file():
        raise CheckpointError(f"{path}: no {MARKER} marker (an interrupted save); it cannot be used")
    try:
        manifest = json.loads(marker.read_text())
        manifest["files"], manifest["keys"]  # noqa: B018  (both must be there)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: {MARKER} marker is unreadable ({exc}); the checkpoint cannot be used") from exc
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_problem(path: str | os.PathLike, verify: str | None = "sha256") -> str | None:
    """Why ``path`` is not a usable checkpoint, or None when it is.

    ``verify``: ``"sha256"`` checks sizes and checksums of every listed file, ``"size"`` sizes only,
    ``None`` only that the marker parses and every file it lists exists.
    """
    path = Path(path)
    if not path.is_dir():
        return f"{path}: not a checkpoint folder"
    try:
        manifest = _read_manifest(path)
    except CheckpointError as exc:
        return str(exc)
    if verify not in (None, "none", "size", "sha256"):
        raise ValueError(f"verify={verify!r}: use 'sha256', 'size' or None")
    for k in manifest["keys"]:
        if f"{k}.pt" not in manifest["files"]:
            return f"{path}: the manifest lists key {k!r} but no file {k}.pt"
    for name in manifest["files"]:  # at every level: a listed file that is gone makes the folder unusable
        if not (path / name).is_file():
            return f"{path}: {name} is listed in the manifest but missing"
    if verify in (None, "none"):
        return None
    for name, info in manifest["files"].items():  # every size first: cheap, and catches truncation
        size = (path / name).stat().st_size
        if size != info["size"]:
            return f"{path}: {name} has {size} bytes, the manifest says {info['size']}"
    if verify == "sha256":
        for name, info in manifest["files"].items():
            if _sha256(path / name) != info["sha256"]:
                return f"{path}: {name} does not match its SHA-256 in the manifest (the file is damaged)"
    return None


def latest_checkpoint(run_dir: str | os.PathLike, verify: str | None = "sha256") -> Path | None:
    """The newest checkpoint under ``run_dir/checkpoints`` that passes :func:`checkpoint_problem`.

    Temporary folders and folders without a marker are never picked; a damaged checkpoint is
    skipped (with a logged warning) in favour of the previous one. None when there is none. Only
    the manifest is checked: :func:`load_latest_checkpoint` also loads, and goes back on a refused load.
    """
    for step, path in reversed(list_checkpoints(run_dir)):
        problem = checkpoint_problem(path, verify)
        if problem is None:
            return path
        log.warning("skipping checkpoint of step %d: %s", step, problem)
    return None


def _is_step_folder(path: Path) -> bool:
    return (path / MARKER).is_file() or bool(_STEP_DIR.match(path.name))


def _run_dir_of(path: Path) -> Path:
    return path.parent if path.name == "checkpoints" else path


def _why_not_loaded(exc: Exception) -> str:
    """What a failed ``torch.load(weights_only=True)`` means, without torch's advice to load it unsafely."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError):
        wanted = re.search(r"GLOBAL ([\w.]+)", text)
        detail = (f"it asks for the Python object `{wanted.group(1)}`" if wanted
                  else "it holds objects other than tensors and plain values")
        return (f"refused by torch.load(weights_only=True): {detail}. A checkpoint this project writes holds "
                f"tensors and plain values only, so the file was altered or written by other code; it is not "
                f"loaded, since unpickling it could run code")
    return f"cannot be read ({type(exc).__name__}: {text.splitlines()[0] if text else ''})"


def _load_verified(path: Path, keys: Iterable[str] | None, map_location: Any) -> dict:
    """Every file of ``path`` checked against the manifest (size, SHA-256), then ``keys`` read with weights_only."""
    problem = checkpoint_problem(path, "sha256")
    if problem is not None:
        raise CheckpointError(problem)
    manifest = _read_manifest(path)
    wanted = list(manifest["keys"]) if keys is None else list(keys)
    missing = [k for k in wanted if k not in manifest["keys"]]
    if missing:
        raise CheckpointError(f"{path}: no entry {missing}; it holds {manifest['keys']}")
    state = {}
    for k in wanted:
        try:
            state[k] = torch.load(path / f"{k}.pt", map_location=map_location, weights_only=True)
        except Exception as exc:  # a damaged zip or an unsafe global: either way unusable, say which file
            raise CheckpointError(f"{path / f'{k}.pt'}: {_why_not_loaded(exc)}") from None
    return state


def load_latest_checkpoint(run_dir: str | os.PathLike, keys: Iterable[str] | None = None,
                           map_location: Any = "cpu", warn: Callable[[str], None] | None = None
                           ) -> tuple[Path, dict] | None:
    """``(folder, state)`` of the newest checkpoint of ``run_dir`` that verifies and loads.

    A refused checkpoint (no marker, a size or SHA-256 mismatch, a file ``torch.load(weights_only=True)``
    refuses) is reported through ``warn`` (default: a logged warning) and the previous one is tried.
    None when ``run_dir`` has no checkpoint folder at all; :class:`CheckpointError` listing every
    folder and why it was refused when it has some but none loads.
    """
    keys = None if keys is None else list(keys)
    warn = warn or log.warning
    refused: list[str] = []
    for step, path in reversed(list_checkpoints(run_dir)):
        try:
            return path, _load_verified(path, keys, map_location)
        except CheckpointError as exc:
            reason = str(exc)
            refused.append(f"  {path.name}: {reason.removeprefix(str(path)).lstrip('/: ')}")
            warn(f"checkpoint of step {step} refused, trying the one before: {reason}")
    if not refused:
        return None
    raise CheckpointError(f"none of the {len(refused)} checkpoint(s) in {checkpoints_dir(run_dir)} can be used:\n"
                          + "\n".join(refused))


def open_checkpoint(path: str | os.PathLike, keys: Iterable[str] | None = None,
                    map_location: Any = "cpu") -> tuple[Path, dict]:
    """``(folder, state)`` from a checkpoint folder, or from a run directory (or its ``checkpoints`` folder):
    its newest checkpoint that loads, as :func:`load_latest_checkpoint`. A named folder is used or refused as it
    is, never swapped for another."""
    path = Path(path).expanduser()
    if _is_step_folder(path):
        return path, _load_verified(path, keys, map_location)
    found = load_latest_checkpoint(_run_dir_of(path), keys, map_location)
    if found is None:
        raise CheckpointError(f"{path}: no complete checkpoint here; pass a checkpoints/step_N folder or a run "
                              f"directory that has one")
    return found


def load_checkpoint(path: str | os.PathLike, keys: Iterable[str] | None = None, map_location: Any = "cpu") -> dict:
    """The state saved at ``path`` (a checkpoint folder or a run directory: its newest loadable checkpoint).

    Every file is checked against the manifest (size and SHA-256) and read with
    ``torch.load(weights_only=True)``. ``keys`` loads only those entries (e.g. ``["model"]`` for
    evaluation); the check covers every file regardless.
    """
    return open_checkpoint(path, keys, map_location)[1]
