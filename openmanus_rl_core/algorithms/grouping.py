"""Group and validity book-keeping shared by the advantage kernels (:mod:`.advantages`): hashable labels to dense
ids, per-group normalisation, turn samples pooled into episodes, and the ``valid`` flags of samples left out of
every statistic. Tensors in, tensors out."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import torch


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32) if t.is_floating_point() else torch.float32


def _check_same_shape(reference_name: str, reference: torch.Tensor, **others: torch.Tensor) -> None:
    if reference.dim() != 2:
        raise ValueError(f"{reference_name} must be [B, T], got shape {tuple(reference.shape)}")
    for name, t in others.items():
        if tuple(t.shape) != tuple(reference.shape):
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but {reference_name} has {tuple(reference.shape)}; "
                "all token tensors must be [B, T]"
            )


def _bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def group_index(group_ids: Any, n: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, int]:
    """Map ``n`` hashable group labels to dense integer ids.

    ``group_ids``: a tensor, a numpy array, or any sequence of hashables (str, int, tuple, ...). Returns
    ``(ids, num_groups)`` with ``ids`` a LongTensor ``[n]`` in ``[0, num_groups)``; equal labels get equal ids.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.shape[0] != n:
            raise ValueError(f"group_ids must have shape [{n}], got {tuple(group_ids.shape)}")
        uniq, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(device=device, dtype=torch.long), int(uniq.numel())
    if isinstance(group_ids, np.ndarray) and group_ids.dtype != object:
        if group_ids.ndim != 1 or group_ids.shape[0] != n:
            raise ValueError(f"group_ids must have shape [{n}], got {group_ids.shape}")
        uniq, inverse = np.unique(group_ids, return_inverse=True)
        return torch.from_numpy(inverse.reshape(-1).astype(np.int64)).to(device), int(uniq.shape[0])
    labels = list(group_ids)
    if len(labels) != n:
        raise ValueError(f"group_ids has {len(labels)} labels but the batch has {n} samples")
    try:
        table = _factorize_table(labels)
    except TypeError as exc:
        raise TypeError(f"group_ids must be hashable labels: {exc}") from None
    codes = torch.frombuffer(array("q", map(table.__getitem__, labels)), dtype=torch.long) if labels else None
    if codes is None:
        return torch.zeros(0, dtype=torch.long, device=device), 0
    return codes.to(device), len(table)


def episode_index(episode_ids: Any, n: int, device: torch.device | str | None = None
                  ) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Turn samples -> episodes: ``(eid [n], E, first [E])``: each row's dense episode id, the number of episodes,
    and each episode's first row (its representative for per-episode labels)."""
    eid, E = group_index(episode_ids, n, device)
    rows = torch.arange(n, device=eid.device)
    first = torch.full((E,), n, dtype=torch.long, device=eid.device).scatter_reduce_(0, eid, rows, reduce="amin")
    return eid, E, first


def _take(labels: Any, index: torch.Tensor) -> Any:
    """``labels`` (tensor, numpy array or sequence) at the rows ``index``."""
    if isinstance(labels, torch.Tensor):
        return labels[index.to(labels.device)]
    if isinstance(labels, np.ndarray):
        return labels[index.cpu().numpy()]
    labels = list(labels)
    return [labels[i] for i in index.tolist()]


def _pooled_scores(scores: torch.Tensor, group_ids: Any, valid: Any, episode_ids: Any):
    """Sequence scores pooled per episode: ``(episode scores [E], episode group ids, episode valid, eid [B],
    first [E])``; an episode's score is the sum of its rows' scores, its group and validity those of its first row."""
    B = scores.shape[0]
    eid, E, first = episode_index(episode_ids, B, scores.device)
    pooled = torch.zeros(E, dtype=scores.dtype, device=scores.device).index_add_(0, eid, scores)
    v = _valid_rows(valid, B, scores.device)
    return pooled, _take(group_ids, first), None if v is None else v[first], eid, first


def _factorize_table(values: list) -> dict:
    """``{value: dense id}`` in first-seen order. ``dict.fromkeys`` and ``map`` keep the per-element work in C."""
    return {v: i for i, v in enumerate(dict.fromkeys(values))}


def _group_normalise(
    scores: torch.Tensor, gid: torch.Tensor, num_groups: int, epsilon: float, norm_by_std: bool,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(s - mean_g) / (std_g + eps)`` (or ``s - mean_g``) per element over the valid members of each group;
    0 for invalid elements and for groups with fewer than two valid members. ``[N] -> [N]``.

    Statistics are taken in float64: near-equal scores have a tiny std that would amplify float32 rounding.
    """
    out_dtype = scores.dtype
    scores = scores.to(torch.float64)
    w = torch.ones_like(scores) if valid is None else valid.to(device=scores.device, dtype=torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, gid, w)
    sums = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, gid, scores * w)
    centered = (scores - (sums / counts.clamp_min(1))[gid]) * w
    # Per-group multiplier: 1 / (std + eps), or 1 without std; 0 for groups of fewer than two valid members.
    if norm_by_std:
        sq = torch.zeros_like(sums).index_add_(0, gid, centered * centered)
        denom = torch.sqrt(sq / (counts - 1).clamp_min(1)) + epsilon
        # A group of equal scores with epsilon=0 has denom 0 (and centered 0): give it advantage 0, not 0/0.
        scale = torch.where(denom > 0, 1.0 / denom.masked_fill(denom <= 0, 1.0), 0.0)
        scale = torch.where(counts > 1, scale, 0.0)
    else:
        scale = (counts > 1).to(torch.float64)
    return (centered * scale[gid]).to(out_dtype)


def _valid_rows(valid: Any, n: int, device: torch.device) -> torch.Tensor | None:
    """``valid`` as a ``[n]`` bool tensor on ``device`` (None stays None: every sample is valid)."""
    if valid is None:
        return None
    v = torch.as_tensor(valid, device=device)
    if v.dim() != 1 or v.shape[0] != n:
        raise ValueError(f"valid must have shape [{n}] (one flag per sample), got {tuple(v.shape)}")
    return _bool(v)


def _valid_tokens(m: torch.Tensor, valid: Any) -> torch.Tensor:
    """The token mask ``[B, T]`` with the rows of invalid samples cleared."""
    v = _valid_rows(valid, m.shape[0], m.device)
    return m if v is None else m & v.unsqueeze(-1)


def _broadcast(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` per-sequence values onto the masked-in tokens of ``[B, T]``, 0 elsewhere."""
    return torch.where(mask, seq_values.unsqueeze(-1), torch.zeros((), dtype=seq_values.dtype, device=mask.device))


def _sequence_scores(token_rewards: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(mask, token_rewards.to(dtype), torch.zeros((), dtype=dtype, device=token_rewards.device)).sum(-1)


def _check_discount(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value



def _numbers_tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor from a list of Python numbers; ``array`` converts about 3x faster than ``torch.tensor``."""
    if not values:
        return torch.zeros(0, dtype=dtype)
    try:
        return torch.frombuffer(array("d" if dtype == torch.float64 else "q", values), dtype=dtype)
    except (TypeError, OverflowError):
        return torch.tensor(values, dtype=dtype)

