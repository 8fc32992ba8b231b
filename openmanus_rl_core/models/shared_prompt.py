"""Shared prompts: rows that start with the same tokens compute those tokens once.

A GRPO group of ``rollout.n`` samples repeats one prompt ``n`` times, and the per-turn samples of ``memory=window``
all start with the same system prompt and task. Both places that run the model over whole rows compute a shared
start once and repeat its keys and values for each row:

- the HF engine's prefill (:mod:`openmanus_rl_core.engines.hf`): each shared prefix is prefilled once, its KV-cache
  rows are repeated per row, and each prompt's rest is prefilled on them before decoding;
- the actor's log-probs and update (:mod:`openmanus_rl_core.workers.logprobs`, ``actor.share_prompts``): each
  shared prefix (:func:`shared_prefixes`: a whole GRPO prompt but its last token, or the common start of per-turn
  prompts) runs once with a KV cache, and the rest of every row runs on the repeated cache. Gradients flow back
  through the repetition, so each prefix position receives the sum of its rows' gradients: exactly what the rows
  computed one by one give.

Attention and every layer treat the rows independently, so the results are those of the full rows (up to the
float rounding of a different batch shape); ``tests/test_shared_prompt.py`` checks log-probs and gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["shared_prefixes", "SharedStarts", "shared_starts", "MIN_SAVED_SHARE", "MAX_WIDER"]

# The shared path costs one more forward call and a copy of the KV cache per row: it is taken only when the
# prefixes it runs once save at least this share of the rows' tokens.
MIN_SAVED_SHARE = 0.1
# Prefixes of different lengths beside rests of different lengths span more columns than the prompts did (the
# longest prefix plus the longest rest); the shared path is taken only while that is at most this many times the
# prompts' width.
MAX_WIDER = 1.25


def shared_prefixes(rows: list[list[int]]) -> tuple[list[int], list[int], list[int]] | None:
    """Which rows share a prefix, and how long it is, for ``rows`` (each row's tokens; compare whatever must be
    equal, e.g. token and position). Returns ``(first, which, length)``: ``first[u]`` a row holding prefix ``u``,
    ``length[u]`` its token count, ``which[b]`` the prefix of row ``b`` (-1: row ``b`` shares none). A prefix
    always leaves at least one token of each of its rows (so each row's next-token logits come from its own pass),
    and the rows are split into prefixes that save the most tokens (``sum length[u] * (rows of u - 1)``). None when
    that saving is under :data:`MIN_SAVED_SHARE` of all the tokens.

    Rows sorted by their tokens put every set of rows that share a prefix next to each other; a contiguous run of
    sorted rows shares the smallest common prefix of its neighbours, so the best split is a dynamic programme over
    the sorted order."""
    B = len(rows)
    total = sum(map(len, rows))
    if B < 2 or total == 0:
        return None
    order = sorted(range(B), key=rows.__getitem__)
    common = [_common_length(rows[order[i]], rows[order[i + 1]]) for i in range(B - 1)]
    # best[j]: the most tokens saved by the rows order[:j]; its last run is order[cut[j]:j], sharing run[j] tokens.
    best, cut, run = [0] * (B + 1), [0] * (B + 1), [0] * (B + 1)
    for j in range(1, B + 1):
        best[j], cut[j] = best[j - 1], j - 1  # order[j - 1] alone
        shared = len(rows[order[j - 1]]) - 1
        for i in range(j - 2, -1, -1):  # the run order[i:j]
            shared = min(shared, common[i], len(rows[order[i]]) - 1)
            if shared <= 0:
                break
            if best[i] + shared * (j - 1 - i) > best[j]:
                best[j], cut[j], run[j] = best[i] + shared * (j - 1 - i), i, shared
    if best[B] < MIN_SAVED_SHARE * total:
        return None
    first: list[int] = []
    length: list[int] = []
    which = [-1] * B
    j = B
    while j > 0:
        i = cut[j]
        if j - i > 1:
            for b in order[i:j]:
                which[b] = len(first)
            first.append(order[i])
            length.append(run[j])
        j = i
    return first, which, length


def _common_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


@dataclass
class SharedStarts:
    """How to run left-padded prompts ``[B, P]`` in two passes, the starts they share once.

    The first pass runs ``head_*`` ``[U, H]`` (each shared prefix once, right-padded) with a KV cache; the cache is
    then repeated per row with ``which`` ``[B]`` (a row that shares nothing takes row 0 and masks all of it). The
    second pass runs each row's last ``width`` prompt columns (and whatever follows them), attending to the cache
    through ``prefix_mask`` ``[B, H]`` and to its own columns through ``rest_mask`` ``[B, width]``: the prompt's
    last ``rest[b]`` tokens, the columns before them masked."""

    head_ids: torch.Tensor
    head_mask: torch.Tensor
    head_pos: torch.Tensor
    which: torch.Tensor
    prefix_mask: torch.Tensor
    rest_mask: torch.Tensor
    width: int


def shared_starts(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> SharedStarts | None:
    """:class:`SharedStarts` for the left-padded prompts ``ids``/``mask``/``pos`` ``[B, P]`` (prefixes compared on
    tokens and positions, :func:`shared_prefixes`), or None when too little is shared, when the longest prefix
    and the longest rest together are more than :data:`MAX_WIDER` times the prompts' width, or when some
    prompt's real tokens are not one run at the right."""
    B, P = ids.shape
    if B < 2 or P == 0:
        return None
    n = mask.sum(-1)
    if not bool((mask.cumsum(-1) == (torch.arange(P, device=ids.device) - (P - n)[:, None] + 1).clamp_min(0)).all()):
        return None
    keys = (ids << 20) | pos  # token and position (< 2**20) in one integer
    found = shared_prefixes([row[P - k:] for row, k in zip(keys.tolist(), n.tolist())])
    if found is None:
        return None
    first, which, length = found
    H, U = max(length), len(first)
    head_ids = ids.new_zeros((U, H))
    head_mask = mask.new_zeros((U, H))
    head_pos = pos.new_zeros((U, H))
    for u, (b, k) in enumerate(zip(first, length)):
        start = P - int(n[b])
        head_ids[u, :k], head_pos[u, :k], head_mask[u, :k] = ids[b, start:start + k], pos[b, start:start + k], 1
    prefix = torch.tensor([length[u] if u >= 0 else 0 for u in which], device=ids.device)
    rest = n - prefix
    width = int(rest.max())
    if H + width > MAX_WIDER * P:  # every later step attends over the cache's and the rest's columns
        return None
    return SharedStarts(
        head_ids=head_ids, head_mask=head_mask, head_pos=head_pos,
        which=torch.tensor([max(u, 0) for u in which], device=ids.device),
        prefix_mask=(torch.arange(H, device=ids.device) < prefix[:, None]).to(mask.dtype),
        rest_mask=mask[:, P - width:] * (torch.arange(width, device=ids.device) >= (width - rest)[:, None]),
        width=width)
