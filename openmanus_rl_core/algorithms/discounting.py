"""Discounted backward recursions over masked-in tokens (return-to-go, and the GAE scan of :mod:`.advantages`).

Each row's masked-in tokens are compacted to the front, then the linear recurrence is solved blockwise with one
batched matmul plus a scan over ``T / 32`` block heads, instead of ``T`` sequential steps. Mask-0 positions
(observation tokens) are transparent: they neither receive nor discount.
"""

from __future__ import annotations

import torch

from .grouping import _bool, _check_discount, _float_dtype


def _scan_dtype(x: torch.Tensor) -> torch.dtype:
    """dtype for the blocked recursion: float32 on CPU at full fp32 matmul precision, else float64.

    The recursion runs through a matmul; where float32 matmuls may drop to TF32/bf16 internally (CUDA, or a lowered
    ``torch.set_float32_matmul_precision``) float64 keeps the result exact to float32 precision.
    """
    if x.dtype != torch.float64 and x.device.type == "cpu" and torch.get_float32_matmul_precision() == "highest":
        return torch.float32
    return torch.float64


def _to_compact(x: torch.Tensor, dump_index: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Move each row's masked-in entries to its front, in order, zeros after: ``[B, T] -> [B, width]``.

    ``dump_index`` is the compact position of each masked-in entry and ``T`` (a spare column) for masked-out ones.
    """
    B, T = x.shape
    out = torch.zeros(B, T + 1, dtype=dtype, device=x.device)
    out.scatter_(1, dump_index, x.to(dtype))
    return out[:, :width]


def _from_compact(xc: torch.Tensor, mask: torch.Tensor, compact_pos: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_to_compact``: ``[B, width] -> [B, T]`` with 0 at masked-out positions."""
    if xc.shape[1] == 0:
        return torch.zeros(mask.shape, dtype=xc.dtype, device=xc.device)
    back = torch.gather(xc, 1, compact_pos.clamp(0, xc.shape[1] - 1))
    return torch.where(mask, back, torch.zeros((), dtype=xc.dtype, device=xc.device))


def _compact_layout(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(compact_pos, dump_index, width)`` for ``_to_compact``/``_from_compact``; width = most masked-in per row."""
    compact_pos = mask.cumsum(1) - 1
    dump_index = torch.where(mask, compact_pos, mask.shape[1])
    width = int(compact_pos[:, -1].max()) + 1 if mask.numel() else 0  # the last column holds count - 1
    return compact_pos, dump_index, width


def _reverse_discounted_cumsum(x: torch.Tensor, c: float, block: int = 32) -> torch.Tensor:
    """``y_i = sum_{j >= i} c^(j - i) x_j`` along dim 1 of ``[B, L]``, for ``0 <= c <= 1``.

    Blocked: one batched matmul with the ``[K, K]`` matrix ``W[j, i] = c^(j-i) (j >= i)`` solves every block locally,
    then a scan over the ``L / K`` block heads carries the tail of each block into the one before it. This replaces
    ``L`` sequential steps with ``L / K``; all powers of ``c`` stay in [0, 1], so it is as stable as the plain scan.
    """
    B, L = x.shape
    if L == 0:
        return x.clone()
    K = min(block, L)
    nb = -(-L // K)
    xb = torch.nn.functional.pad(x, (0, nb * K - L)).view(B, nb, K)
    i = torch.arange(K, dtype=x.dtype, device=x.device)
    expo = i.unsqueeze(1) - i.unsqueeze(0)  # [j, i] -> j - i
    W = torch.where(expo >= 0, torch.pow(c, expo.clamp_min(0)), torch.zeros((), dtype=x.dtype, device=x.device))
    local = xb @ W  # each block's own discounted sums
    heads = local[:, :, 0]
    starts = torch.empty_like(heads)  # y at each block's first position, including later blocks
    running = torch.zeros(B, dtype=x.dtype, device=x.device)
    cK = c**K
    for n in range(nb - 1, -1, -1):
        running = heads[:, n] + cK * running
        starts[:, n] = running
    next_start = torch.nn.functional.pad(starts[:, 1:], (0, 1))
    tail_weight = torch.pow(c, K - i)  # c^(K - i): how much of the next block's start reaches position i
    y = local + next_start.unsqueeze(-1) * tail_weight
    return y.reshape(B, nb * K)[:, :L]


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go over masked-in positions, carried across mask-0 positions: ``[B, T] -> [B, T]``.

    ``G_t = r_t + gamma * G_next`` where ``next`` is the next position with mask 1 (``G = 0`` past the last);
    mask-0 positions get 0 and do not discount. ``0 <= gamma <= 1``. Returned in the rewards' float dtype (at least
    float32).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, T], got shape {tuple(rewards.shape)}")
    gamma = _check_discount("gamma", gamma)
    m = _bool(mask)
    compact_pos, dump_index, width = _compact_layout(m)
    returns = _reverse_discounted_cumsum(_to_compact(rewards, dump_index, width, _scan_dtype(rewards)), gamma)
    return _from_compact(returns, m, compact_pos).to(_float_dtype(rewards))

