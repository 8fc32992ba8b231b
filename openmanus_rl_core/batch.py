"""`Batch`: the container that carries one training step's data between rollout, rewards, algorithms and workers.

In the spirit of verl's ``DataProto``, with three parts:

- ``tensors``: ``dict[str, torch.Tensor]``, every tensor sharing dim 0 (the batch size ``B``);
- ``non_tensors``: ``dict[str, numpy.ndarray]``, 1-D object arrays of length ``B`` holding per-sample Python values
  (strings, numbers, lists, dicts);
- ``meta``: ``dict``, run-level values that are not per sample (temperature, global step, ...).

Every operation that selects rows (indexing, ``chunk``, ``split``, ``concat``) applies the same row selection to
``tensors`` and ``non_tensors`` and keeps ``meta`` as is. Operations return new ``Batch`` objects; the tensors they
hold may be views of the original ones (as with torch slicing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["Batch", "MissingKeyError"]

class MissingKeyError(KeyError):
    """A required batch field is absent. Subclasses KeyError; its message is printed verbatim (not repr-quoted)."""

    def __str__(self) -> str:  # KeyError.__str__ would quote the message
        return str(self.args[0]) if self.args else ""


def _object_array(values: Any, name: str) -> np.ndarray:
    """Turn a per-sample sequence into a 1-D object array without letting numpy split nested lists into dims."""
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise ValueError(f"non-tensor field {name!r} must be 1-D per-sample data, got a 0-d array")
        if values.dtype == object and values.ndim == 1:
            return values
        if values.ndim == 1:
            return values.astype(object)
        # A 2-D numeric array: one row per sample, each row kept as its own array.
        out = np.empty(values.shape[0], dtype=object)
        for i in range(values.shape[0]):
            out[i] = values[i]
        return out
    if isinstance(values, torch.Tensor):
        raise TypeError(f"field {name!r} is a tensor; put it in Batch.tensors, not non_tensors")
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(
            f"non-tensor field {name!r} must be a per-sample sequence (list, tuple, 1-D numpy array), "
            f"got {type(values).__name__}"
        )
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise so that list-valued samples stay lists
        out[i] = v
    return out


def _values_equal(a: Any, b: Any) -> bool:
    """Equality that works for tensors, numpy arrays and plain Python values."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        return all(_values_equal(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
    try:
        eq = a == b
        return bool(eq)
    except Exception:  # e.g. ambiguous truth values of exotic containers
        return False


def _merge_meta(metas: Sequence[Mapping[str, Any]], what: str) -> dict:
    merged: dict[str, Any] = {}
    for meta in metas:
        for key, value in meta.items():
            if key in merged and not _values_equal(merged[key], value):
                raise ValueError(
                    f"{what}: meta key {key!r} has conflicting values {merged[key]!r} and {value!r}; "
                    "make them equal or drop one before combining"
                )
            merged[key] = value
    return merged


class Batch:
    """Per-sample tensors and Python values sharing a batch dimension, plus run-level ``meta``.

    Construct with ``Batch(tensors={...}, non_tensors={...}, meta={...})``. Non-tensor values may be any per-sample
    sequence; they are stored as 1-D numpy object arrays. All fields must have the same length along dim 0,
    otherwise ``ValueError`` names every field with its size.

    Indexing: ``batch["name"]`` returns that tensor or object array; ``batch[i]`` (int) returns a batch of one row;
    ``batch[a:b]``, ``batch[index_list_or_tensor]``, ``batch[bool_mask]`` return the selected rows.
    """

    __slots__ = ("tensors", "non_tensors", "meta")

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {
            k: _object_array(v, k) for k, v in (non_tensors or {}).items()
        }
        self.meta: dict[str, Any] = dict(meta or {})
        for key, value in self.tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"tensor field {key!r} is a {type(value).__name__}, not a torch.Tensor")
            if value.dim() == 0:
                raise ValueError(f"tensor field {key!r} is 0-d; batch tensors need a leading batch dimension")
        overlap = self.tensors.keys() & self.non_tensors.keys()
        if overlap:
            raise ValueError(f"fields {sorted(overlap)} appear in both tensors and non_tensors; keep one")
        self._check_sizes()

    # ----------------------------------------------------------------------------------------------- basics
    def _sizes(self) -> dict[str, int]:
        sizes = {k: int(v.shape[0]) for k, v in self.tensors.items()}
        sizes.update({k: int(v.shape[0]) for k, v in self.non_tensors.items()})
        return sizes

    def _check_sizes(self) -> None:
        sizes = self._sizes()
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{k}={n}" for k, n in sizes.items())
            raise ValueError(f"misaligned batch: fields have different sizes along dim 0: {listing}")

    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for v in self.non_tensors.values():
            return int(v.shape[0])
        return 0

    def keys(self) -> list[str]:
        """All field names: tensor keys first, then non-tensor keys."""
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __repr__(self) -> str:
        t = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.tensors.items())
        n = ", ".join(self.non_tensors)
        return f"Batch(len={len(self)}, tensors={{{t}}}, non_tensors=[{n}], meta={sorted(self.meta)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        if self.tensors.keys() != other.tensors.keys() or self.non_tensors.keys() != other.non_tensors.keys():
            return False
        return (
            all(_values_equal(v, other.tensors[k]) for k, v in self.tensors.items())
            and all(_values_equal(v, other.non_tensors[k]) for k, v in self.non_tensors.items())
            and _values_equal(self.meta, other.meta)
        )

    __hash__ = None  # mutable container

    def _new(self, tensors: dict, non_tensors: dict, meta: dict | None = None) -> Batch:
        out = Batch.__new__(Batch)
        out.tensors = tensors
        out.non_tensors = non_tensors
        out.meta = dict(self.meta if meta is None else meta)
        return out

    # ------------------------------------------------------------------------------------------- key access
    def require(self, *keys: str, who: str = "this operation") -> None:
        """Raise ``MissingKeyError`` naming every key in ``keys`` that the batch lacks."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise MissingKeyError(
                f"{who} needs batch field(s) {missing}, which are missing; the batch has tensors "
                f"{sorted(self.tensors)} and non_tensors {sorted(self.non_tensors)}"
            )

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.non_tensors.get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        """``batch["name"] = value``: a tensor goes to ``tensors``, anything else to ``non_tensors``."""
        if not isinstance(key, str):
            raise TypeError(f"Batch keys are strings, got {type(key).__name__}; rows are read-only via indexing")
        n = len(self) if (len(self.tensors) + len(self.non_tensors)) - (key in self) > 0 else None
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"tensor field {key!r} is 0-d; batch tensors need a leading batch dimension")
            size = int(value.shape[0])
        else:
            value = _object_array(value, key)
            size = int(value.shape[0])
        if n is not None and size != n:
            raise ValueError(f"misaligned batch: field {key!r} has size {size} along dim 0, the batch has {n}")
        self.tensors.pop(key, None)
        self.non_tensors.pop(key, None)
        (self.tensors if isinstance(value, torch.Tensor) else self.non_tensors)[key] = value

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, str):
            if item in self.tensors:
                return self.tensors[item]
            if item in self.non_tensors:
                return self.non_tensors[item]
            self.require(item, who="batch[...]")
        return self._take(item)

    # ------------------------------------------------------------------------------------------ row access
    def _row_index(self, item: Any) -> slice | torch.Tensor:
        """Normalise an int / slice / list / array / tensor / bool mask into a slice or a long index tensor."""
        n = len(self)
        if isinstance(item, slice):
            return item
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            i = int(item)
            if not -n <= i < n:
                raise IndexError(f"row {i} is out of range for a batch of {n}")
            return slice(i % n, i % n + 1)
        if isinstance(item, torch.Tensor):
            idx = item.detach().cpu()
        elif isinstance(item, (np.ndarray, list, tuple, range)):
            arr = np.asarray(item)
            if arr.size == 0:
                arr = arr.astype(np.int64)
            if arr.dtype == object:
                raise TypeError("row index must contain ints or bools only")
            idx = torch.from_numpy(np.ascontiguousarray(arr))
        else:
            raise TypeError(
                f"cannot index a Batch with {type(item).__name__}; use a field name, int, slice, "
                "index list/array/tensor, or a bool mask"
            )
        if idx.dim() != 1:
            raise IndexError(f"row index must be 1-D, got shape {tuple(idx.shape)}")
        if idx.dtype == torch.bool:
            if idx.shape[0] != n:
                raise IndexError(f"bool mask has length {idx.shape[0]}, the batch has {n} rows")
            return idx.nonzero().flatten()
        if idx.is_floating_point() or idx.is_complex():
            raise TypeError(f"row index must be integer or bool, got dtype {idx.dtype}")
        idx = idx.long()
        if idx.numel() and (int(idx.max()) >= n or int(idx.min()) < -n):
            raise IndexError(f"row index out of range for a batch of {n}: min {int(idx.min())}, max {int(idx.max())}")
        return torch.where(idx < 0, idx + n, idx)

    def _take(self, item: Any) -> Batch:
        idx = self._row_index(item)
        if isinstance(idx, slice):
            tensors = {k: v[idx] for k, v in self.tensors.items()}
            non_tensors = {k: v[idx] for k, v in self.non_tensors.items()}
        else:
            np_idx = idx.numpy()
            tensors = {k: v[idx.to(v.device)] for k, v in self.tensors.items()}
            non_tensors = {k: v[np_idx] for k, v in self.non_tensors.items()}
        return self._new(tensors, non_tensors)

    def select(self, keys: Iterable[str], *, keep_meta: bool = True) -> Batch:
        """A batch with only the named fields (tensor or non-tensor); unknown names raise ``MissingKeyError``."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        self.require(*keys, who="Batch.select")
        return self._new(
            {k: self.tensors[k] for k in keys if k in self.tensors},
            {k: self.non_tensors[k] for k in keys if k in self.non_tensors},
            self.meta if keep_meta else {},
        )

    def chunk(self, n: int) -> list[Batch]:
        """Split into exactly ``n`` consecutive parts whose sizes differ by at most one (``np.array_split`` rule).

        For equal parts (data-parallel dispatch) first call ``pad_to_divisor(n)``.
        """
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"chunk(n) needs a positive int, got {n!r}")
        base, extra = divmod(len(self), int(n))
        out, start = [], 0
        for i in range(int(n)):
            stop = start + base + (1 if i < extra else 0)
            out.append(self[start:stop])
            start = stop
        return out

    def split(self, size: int) -> list[Batch]:
        """Consecutive parts of ``size`` rows each; the last one may be shorter. An empty batch gives ``[]``."""
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"split(size) needs a positive int, got {size!r}")
        return [self[i : i + int(size)] for i in range(0, len(self), int(size))]

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Stack batches along dim 0. All must have the same field names; ``meta`` is merged (conflicts raise)."""
        batches = list(batches)
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        first = batches[0]
        for i, b in enumerate(batches[1:], start=1):
            if b.tensors.keys() != first.tensors.keys() or b.non_tensors.keys() != first.non_tensors.keys():
                raise ValueError(
                    f"Batch.concat: batch {i} has fields {b.keys()}, batch 0 has {first.keys()}; "
                    "all batches must carry the same fields"
                )
        tensors = {k: torch.cat([b.tensors[k] for b in batches], dim=0) for k in first.tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        meta = _merge_meta([b.meta for b in batches], "Batch.concat")
        return first._new(tensors, non_tensors, meta)

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append rows (copies of the first rows, cyclically) so that ``len`` divides by ``divisor``.

        Returns ``(padded_batch, pad_size)``; the first ``len(self)`` rows of ``padded_batch`` are the original ones.
        """
        if not isinstance(divisor, (int, np.integer)) or divisor < 1:
            raise ValueError(f"pad_to_divisor needs a positive int, got {divisor!r}")
        n = len(self)
        pad = (-n) % int(divisor)
        if pad == 0:
            return self, 0
        if n == 0:
            raise ValueError("cannot pad an empty batch: there is no row to copy")
        return Batch.concat([self, self[torch.arange(pad) % n]]), pad

    def to(self, device: torch.device | str) -> Batch:
        """Move every tensor to ``device``; non-tensors and meta are shared."""
        return self._new({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors))
