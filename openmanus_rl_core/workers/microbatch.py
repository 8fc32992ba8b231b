"""Micro-batches by a token budget, rows bucketed by length, and padding columns trimmed per micro-batch.

A row of the batch layout (:mod:`openmanus_rl_core.workers`) is ``[pad.. prompt | response ..pad]``: the prompt is
left-padded in ``[0, P)``, the response right-padded in ``[P, P + R)``. A micro-batch of rows costs
``rows x (longest prompt + longest response)`` token positions once its all-padding columns are cut
(:func:`trim_columns`), so rows of similar length go together (:func:`plan_micro_batches`).

Splitting never changes the update: each micro-batch's token-mean loss is weighted by its share of the
mini-batch's response tokens (:func:`token_share`), and per-row results are put back in the original row order
(:func:`restore_rows`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from openmanus_rl_core.batch import Batch

# Row-aligned tensors of the response layout ``[B, R]`` (``choice_ids``, ``ref_choice_log_probs`` and
# ``choice_values``: ``[B, R, K]``): cut to the micro-batch's longest response.
RESPONSE_KEYS = ("responses", "response_mask", "advantages", "old_log_probs", "ref_log_probs", "rollout_log_probs",
                 "values", "returns", "choice_ids", "ref_choice_log_probs", "choice_values")
# Row-aligned tensors of the whole sequence ``[B, P + R]``.
SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")


def row_extents(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the prompt tokens (attended positions in ``[0, P)``) and the response extent (last attended
    position in ``[P, P + R)`` minus ``P`` plus one; observation tokens inside a multi-turn response count)."""
    attn = batch["attention_mask"]
    R = batch["responses"].shape[1]
    P = attn.shape[1] - R
    prompt = attn[:, :P].sum(-1)
    resp = attn[:, P:] != 0
    cols = torch.arange(1, R + 1, device=attn.device).expand_as(resp)
    extent = (cols * resp).amax(-1) if R else torch.zeros_like(prompt)
    return prompt.cpu().numpy().astype(np.int64), extent.cpu().numpy().astype(np.int64)


def _part_cost(prompt: np.ndarray, resp: np.ndarray) -> int:
    return int(len(prompt) * (prompt.max() + max(1, resp.max())))


def _greedy(order: np.ndarray, prompt: np.ndarray, resp: np.ndarray, cap: int, max_rows: int) -> list[list[int]]:
    """Consecutive rows of ``order`` into parts whose trimmed size stays within ``cap`` (one row always fits)."""
    parts: list[list[int]] = []
    cur: list[int] = []
    pmax = rmax = 0
    for i in order.tolist():
        p, r = max(pmax, prompt[i]), max(rmax, resp[i], 1)
        if cur and (len(cur) >= max_rows or (len(cur) + 1) * (p + r) > cap):
            parts.append(cur)
            cur, p, r = [], prompt[i], max(resp[i], 1)
        cur.append(i)
        pmax, rmax = p, r
    if cur:
        parts.append(cur)
    return parts


def plan_micro_batches(prompt: np.ndarray, resp: np.ndarray, max_tokens: int | None, max_rows: int | None,
                       num_parts: int | None = None) -> list[list[int]]:
    """Row indices of each micro-batch.

    ``max_tokens`` unset: rows in their order, ``max_rows`` per part (all at once when that is unset too).
    Set: rows sorted by length (longest first), then consecutive runs whose trimmed size
    ``rows x (longest prompt + longest response)`` stays within ``max_tokens`` (a longer single row is a part of
    its own), at most ``max_rows`` rows each. ``num_parts``: make exactly that many parts (at most the row count;
    sharded ranks must run the same number of forward passes), as even in size as the order allows.
    """
    n = len(prompt)
    if not max_tokens:
        size = int(max_rows) if max_rows and max_rows < n else n
        return [list(range(s, min(n, s + size))) for s in range(0, n, size)] if n else []
    rows = int(max_rows) if max_rows else n
    order = np.argsort(-(prompt + resp), kind="stable")
    parts = _greedy(order, prompt, resp, int(max_tokens), rows)
    if num_parts is None or len(parts) >= num_parts:
        return parts
    # Fewer parts than the other ranks: the smallest cap that still gives at most num_parts parts.
    lo, hi = 1, int(max_tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy(order, prompt, resp, mid, rows)) <= num_parts:
            hi = mid
        else:
            lo = mid + 1
    parts = _greedy(order, prompt, resp, lo, rows)
    while len(parts) < min(num_parts, n):  # a jump in the part count: halve the part with most rows
        k = max(range(len(parts)), key=lambda j: len(parts[j]))
        half = len(parts[k]) // 2
        parts[k:k + 1] = [parts[k][:half], parts[k][half:]]
    return parts


def trim_columns(batch: Batch) -> tuple[Batch, int]:
    """``batch`` without the columns that are padding in every row: the prompt's leading columns and the
    response's trailing ones. Returns the trimmed batch (row-aligned keys of the layout only) and the original
    ``R``; the trimmed batch has ``R' <= R`` response columns (at least one)."""
    prompt, resp = row_extents(batch)
    R = batch["responses"].shape[1]
    P = batch["attention_mask"].shape[1] - R
    # At least one prompt column stays: the first response token's logit comes from the position before it, so
    # rows with no prompt at all (an episode whose env failed at reset) still give ``R' + 1`` positions.
    lo = P - max(1, int(prompt.max())) if len(prompt) and P else 0
    keep = max(1, int(resp.max())) if len(resp) else R
    keep = min(keep, R)
    out = {}
    for k in SEQUENCE_KEYS:
        if k in batch:
            out[k] = batch[k][:, lo:P + keep]
    for k in RESPONSE_KEYS:
        if k in batch:
            out[k] = batch[k][:, :keep]
    return Batch(tensors=out), R


def pad_columns(x: torch.Tensor, R: int) -> torch.Tensor:
    """``[B, R', ...]`` back to ``[B, R, ...]``, zeros in the cut (padding) columns."""
    if x.shape[1] == R:
        return x
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, R - x.shape[1]))


def on_trimmed(fn: Callable[[Batch], torch.Tensor], batch: Batch) -> torch.Tensor:
    """``fn`` (a per-response-token result ``[B, R']``) on the trimmed ``batch``, padded back to ``[B, R]``."""
    small, R = trim_columns(batch)
    return pad_columns(fn(small), R)


def token_share(part: Batch, mini_batch_tokens: float) -> float:
    """A micro-batch's weight in its mini-batch: its share of the response tokens. Summing token-mean losses
    weighted so gives the mini-batch's token-mean loss, however the rows are split."""
    return float(part["response_mask"].sum()) / mini_batch_tokens


def restore_rows(parts: list[torch.Tensor], index: list[list[int]]) -> torch.Tensor:
    """Per-row results of the parts (rows in ``index`` order) put back in the original row order."""
    out = torch.cat(parts)
    order = torch.tensor([i for part in index for i in part], dtype=torch.long)
    restored = torch.empty_like(out)
    restored[order] = out
    return restored
