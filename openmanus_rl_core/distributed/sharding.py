"""A batch split among the ranks of a worker group, and the ranks' results put back together."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def split_evenly(items: Sequence[Any], n: int) -> list[list[Any]]:
    """``n`` consecutive parts whose sizes differ by at most one (order kept: part r goes to rank r)."""
    base, extra = divmod(len(items), n)
    out, start = [], 0
    for r in range(n):
        stop = start + base + (1 if r < extra else 0)
        out.append(list(items[start:stop]))
        start = stop
    return out


def shard_batch(batch, n: int):
    """Equal shards for ``n`` ranks (FSDP needs every rank to run the same number of forward passes).

    Rows added to make the size divisible are copies whose ``response_mask`` is zeroed and whose ``valid`` flag
    is cleared (they train nothing). Returns ``(shards, pad)``.
    """
    padded, pad = batch.pad_to_divisor(n)
    if pad:
        for key, off in (("response_mask", 0), ("valid", False)):
            if key in padded:
                cleared = padded[key].clone()
                cleared[-pad:] = off
                padded[key] = cleared
    return padded.chunk(n), pad


def cat_rows(parts: Sequence[torch.Tensor], pad: int) -> torch.Tensor:
    """The ranks' per-row results in row order, without the ``pad`` rows :func:`shard_batch` added."""
    out = torch.cat(list(parts), dim=0)
    return out[: out.shape[0] - pad] if pad else out
