"""Policy and value losses, loss aggregation, and the masked statistics the algorithms share.

Pure tensor functions. Token tensors are ``[B, T]``; ``response_mask`` / ``loss_mask`` is 1 (or True) on tokens the
model generated and 0 elsewhere (prompt, padding, and environment observation tokens inside a multi-turn response).
Masked-out positions never contribute, even when they hold NaN or inf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "LOSS_AGG_MODES",
    "agg_loss",
    "all_action_loss",
    "entropy_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "ppo_clip_loss",
    "value_loss",
]


# ------------------------------------------------------------------------------------------ masked statistics
def _as_bool_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)} but the values have shape {tuple(like.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(values * mask)`` over ``dim`` (all elements when None); masked-out entries are ignored, NaN included."""
    m = _as_bool_mask(mask, values)
    zeroed = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return zeroed.sum() if dim is None else zeroed.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(values * mask) / sum(mask)`` over ``dim`` (all elements when None). An empty mask gives 0."""
    m = _as_bool_mask(mask, values)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(values, m, dim) / count.clamp_min(1).to(values.dtype)


def _masked_centered(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x - mean) * mask``, the masked mean, and the masked-in count, for a bool ``mask``."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    count = mask.sum()
    mean = torch.where(mask, values, zero).sum() / count.clamp_min(1).to(values.dtype)
    return torch.where(mask, values - mean, zero), mean, count


def _unbiased_var(centered: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    denom = (count - 1).to(centered.dtype)
    zero = torch.zeros((), dtype=centered.dtype, device=centered.device)
    return torch.where(denom > 0, centered.square().sum() / denom.clamp_min(1), zero)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked-in entries (scalar): ``sum(mask*(x-mean)^2) / (n-1)`` (``/ n`` when not unbiased).

    With fewer than two masked-in entries the unbiased variance is undefined; it is returned as 0.
    """
    m = _as_bool_mask(mask, values)
    centered, _, count = _masked_centered(values, m)
    if unbiased:
        return _unbiased_var(centered, count)
    return centered.square().sum() / count.clamp_min(1).to(values.dtype)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and unbiased var over the masked-in entries; masked-out -> 0.

    With ``shift_mean=False`` the mean is added back (scale only). Shapes: any, ``mask`` like ``values``.
    """
    m = _as_bool_mask(mask, values)
    centered, mean, count = _masked_centered(values, m)
    whitened = centered * torch.rsqrt(_unbiased_var(centered, count) + eps)
    if not shift_mean:
        whitened = torch.where(m, whitened + mean, torch.zeros((), dtype=values.dtype, device=values.device))
    return whitened


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last dim: ``H = logsumexp(z) - sum(softmax(z) * z)``.

    Shapes: ``[..., V] -> [...]``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


# ------------------------------------------------------------------------------------------ loss aggregation
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_constant: float | None) -> torch.Tensor:
    return masked_mean(loss_mat, mask)


def _seq_mean(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Rows without a single response token (e.g. an episode that failed before generating) carry no loss.
    has_tokens = mask.any(dim=-1)
    return masked_mean(per_seq, has_tokens)


def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, norm_constant: float | None) -> torch.Tensor:
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1), mask)


def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_constant: float | None) -> torch.Tensor:
    return _seq_mean(masked_mean(loss_mat, mask, dim=-1), mask)


def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, norm_constant: float | None) -> torch.Tensor:
    # Dr. GRPO: a constant normaliser removes the length bias that a per-sequence token mean introduces.
    norm = float(mask.shape[-1]) if norm_constant is None else float(norm_constant)
    if norm <= 0:
        raise ValueError(f"norm_constant must be positive, got {norm_constant!r}")
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1) / norm, mask)


LOSS_AGG_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    Modes (``m`` = mask, ``L`` = loss_mat, sums over ``t``; "mean over sequences" counts rows with any ``m = 1``):

    - ``token-mean``: ``sum_bt(L*m) / sum_bt(m)``
    - ``seq-mean-token-sum``: ``mean_b( sum_t(L*m) )``
    - ``seq-mean-token-mean``: ``mean_b( sum_t(L*m) / sum_t(m) )``
    - ``seq-mean-token-sum-norm``: ``mean_b( sum_t(L*m) / C )`` with ``C = norm_constant or T`` (Dr. GRPO)
    """
    try:
        fn = LOSS_AGG_MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {sorted(LOSS_AGG_MODES)}") from None
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, T], got shape {tuple(loss_mat.shape)}")
    mask = _as_bool_mask(loss_mask, loss_mat, "loss_mask")
    return fn(loss_mat, mask, norm_constant)


# ---------------------------------------------------------------------------------------------- policy loss
def all_action_loss(logp_choices: torch.Tensor, values: torch.Tensor,
                    choice_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The all-action loss at each position where a constraint allowed several tokens, and that position's value
    gap; both ``[B, R]``, 0 where the reply was free or a token was forced.

    ``logp_choices`` ``[B, R, K]``: the policy's log-probabilities of the allowed tokens, renormalised over them
    (``workers/logprobs.py``); ``values`` ``[B, R, K]``: each allowed token's value (the value table's
    ``choice_values``); both laid out as ``choice_ids`` (ids, -1 padding). The loss is
    ``-sum_b (Q(b) - mean_a Q(a)) log pi(b)`` with the values held fixed (``mean_a`` over the allowed tokens): its
    gradient on the logit of allowed token ``b`` is ``-(Q(b) - mean_a Q(a))``, each token's logit moved by its value
    whatever its probability (Neural Replicator Dynamics, Hennes et al. 2020; the shift common to every token leaves
    the policy as the replicator's ``Q(b) - sum_a pi(a) Q(a)`` would). Unlike the policy gradient's expectation
    ``pi(b) (Q(b) - V)``, the push does not vanish as a token's probability does, so a token the policy has nearly
    dropped comes back once its value beats the others'. The gap is ``max_b Q(b) - sum_a pi(a) Q(a)``, what the best
    allowed token is worth over the policy's mean.
    """
    allowed = choice_ids >= 0
    on = allowed[..., 1]
    k = allowed.sum(-1, keepdim=True).clamp_min(1)
    q = values.to(logp_choices.dtype).masked_fill(~allowed, 0.0)
    centred = (q - q.sum(-1, keepdim=True) / k).masked_fill(~allowed, 0.0)
    loss = -(centred * logp_choices.masked_fill(~allowed, 0.0)).sum(-1)
    pi = logp_choices.detach().exp().masked_fill(~allowed, 0.0)
    gap = q.masked_fill(~allowed, float("-inf")).amax(-1) - (pi * q).sum(-1)
    zero = torch.zeros((), dtype=logp_choices.dtype, device=logp_choices.device)
    return torch.where(on, loss, zero), torch.where(on, gap, zero)


def policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and dual-clip.

    With ``r = exp(clamp(logprob - old_logprob, -20, 20))`` and advantage ``A``, per token:

        L1 = -A * r
        L2 = -A * clamp(r, 1 - clip_low, 1 + clip_high)
        L  = max(L1, L2)
        if clip_c is given (dual-clip, Ye et al. 2020) and A < 0:  L = min(L, -A * clip_c)

    then ``loss = agg_loss(L, response_mask, agg_mode)``. The log-ratio clamp keeps ``exp`` finite.

    Shapes: all inputs ``[B, T]``; returns a scalar loss (differentiable w.r.t. ``logprob``) and metrics:
    ``pg_loss``, ``clipfrac`` (fraction of tokens where the clipped term is active), ``clipfrac_lower``
    (fraction where the dual-clip cap is active), ``approx_kl`` (``mean_mask(old_logprob - logprob)``, verl's
    convention), ``ratio_mean``; all Python floats.
    """
    if clip_low < 0 or clip_low >= 1:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"clip_c (dual-clip bound) must be > 1 when given, got {clip_c!r}; pass None to disable it")
    for name, t in (("old_logprob", old_logprob), ("advantages", advantages), ("response_mask", response_mask)):
        if t.shape != logprob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprob has {tuple(logprob.shape)}")
    mask = _as_bool_mask(response_mask, logprob, "response_mask")

    log_ratio = logprob - old_logprob
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped

    if clip_c is not None:
        loss_cap = -advantages * clip_c
        negative = advantages < 0
        capped = negative & (loss_ppo > loss_cap)
        loss_tok = torch.where(negative, torch.minimum(loss_ppo, loss_cap), loss_ppo)
    else:
        capped = torch.zeros_like(mask)
        loss_tok = loss_ppo

    loss = agg_loss(loss_tok, mask, agg_mode)
    with torch.no_grad():
        n = mask.sum().clamp_min(1)
        stats = torch.stack([
            (clipped & mask).sum() / n,
            (capped & mask).sum() / n,
            masked_sum(-log_ratio.detach(), mask) / n,
            masked_sum(ratio.detach(), mask) / n,
        ]).tolist()  # one device-to-host transfer for all metrics
        metrics = {"pg_loss": float(loss.detach())}
        metrics.update(zip(("clipfrac", "clipfrac_lower", "approx_kl", "ratio_mean"), stats))
    return loss, metrics


def ppo_clip_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    **cfg: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Entry point ``openmanus_rl.losses: ppo_clip``: ``policy_loss`` configured from ``cfg``.

    cfg keys (others are ignored): ``clip_low`` (0.2), ``clip_high`` (0.2; DAPO uses 0.28), ``clip_c`` (None:
    no dual-clip; e.g. 3.0), ``agg_mode`` ("token-mean").
    """
    def get(key: str, default: Any) -> Any:  # a config's null means "use the default"
        return default if cfg.get(key) is None else cfg[key]

    return policy_loss(
        old_logprob,
        logprob,
        advantages,
        response_mask,
        clip_low=float(get("clip_low", 0.2)),
        clip_high=float(get("clip_high", 0.2)),
        clip_c=None if cfg.get("clip_c") is None else float(cfg["clip_c"]),
        agg_mode=str(get("agg_mode", "token-mean")),
    )


# ----------------------------------------------------------------------------------------------- value loss
def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip: float | None = 0.2,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO): per token

        v_clip = old_values + clamp(values - old_values, -clip, clip)
        L = 0.5 * max((values - returns)^2, (v_clip - returns)^2)

    aggregated with ``agg_loss(L, response_mask, agg_mode)`` (token-mean by default). ``clip=None`` disables
    clipping (``L = 0.5 * (values - returns)^2``). Shapes: all ``[B, T]``; returns a scalar and metrics
    ``vf_loss``, ``vf_clipfrac`` (fraction of tokens where the clipped term is the larger), ``vpred_mean``.
    """
    for name, t in (("old_values", old_values), ("returns", returns), ("response_mask", response_mask)):
        if t.shape != values.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, values has {tuple(values.shape)}")
    if clip is not None and clip < 0:
        raise ValueError(f"value clip must be >= 0 or None, got {clip!r}")
    mask = _as_bool_mask(response_mask, values, "response_mask")
    err_unclipped = (values - returns) ** 2
    if clip is None:
        loss_tok = 0.5 * err_unclipped
        clipped = torch.zeros_like(mask)
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err_clipped = (v_clipped - returns) ** 2
        loss_tok = 0.5 * torch.maximum(err_unclipped, err_clipped)
        clipped = err_clipped > err_unclipped
    loss = agg_loss(loss_tok, mask, agg_mode)
    with torch.no_grad():
        metrics = {
            "vf_loss": float(loss.detach()),
            "vf_clipfrac": float(masked_mean(clipped.to(values.dtype), mask)),
            "vpred_mean": float(masked_mean(values.detach(), mask)),
        }
    return loss, metrics
