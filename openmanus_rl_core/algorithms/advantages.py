"""Advantage estimators: GAE, GRPO (and Dr. GRPO), RAE, RLOO and REINFORCE++. Those that credit each turn of a
multi-turn episode on its own (GiGPO, the per-state baseline) are in :mod:`.steps`.

Conventions (all estimators):

- Token tensors are ``[B, T]``. ``response_mask`` is 1 (or True) on tokens the model generated. Positions with mask 0
  *inside* a response (environment observation tokens of a multi-turn episode) are skipped: rewards there are
  ignored, and backward recursions carry their state across them unchanged, so observation tokens are transparent.
- Every returned advantage is 0 at mask-0 positions.
- Group statistics (GRPO, RLOO, GiGPO) are vectorised with ``index_add``/``bincount`` over integer group ids; any
  hashable labels (strings, ints, tuples, or a tensor) are accepted and mapped to ids first. Standard deviations
  are unbiased (Bessel-corrected, as ``torch.std``), and a group of one sample gets advantage 0.
- ``valid`` (``[B]`` bool, optional, the batch's ``valid`` tensor): samples excluded from training (an ``env_error``
  episode unless kept, a padding row) leave every statistic: group means, stds and counts (GRPO, RLOO, GiGPO), and
  the whitening of GAE and REINFORCE++. Their advantage is 0, and a group with fewer than two valid members
  gets 0 for every member.
- Results come back in the inputs' float dtype (at least float32), computed without autograd (advantages are
  targets, not graph nodes). Group statistics run in float64 internally; so do discounted recursions wherever a
  float32 matmul might lose precision (see ``_scan_dtype``).
- The backward recursions (GAE, discounted returns) run in :mod:`.discounting`; group ids, pooling and validity
  in :mod:`.grouping`.

These are the pure kernels, in the manner of verl's ``core_algos``: tensors and labels in, tensors out, no
``Batch`` and no config. Their registered entry points (group ``openmanus_rl.advantages``: ``gae``, ``grpo``, ...),
which read a ``Batch`` and the algorithm's kwargs, are in :mod:`.estimators`.
"""

from __future__ import annotations

from typing import Any

import torch

from .discounting import (_compact_layout, _from_compact, _reverse_discounted_cumsum, _scan_dtype, _to_compact,
                          discounted_returns)
from .grouping import (_bool, _broadcast, _check_discount, _check_same_shape, _float_dtype, _group_normalise,
                       _pooled_scores, _sequence_scores, _valid_rows, _valid_tokens, episode_index, group_index)
from .losses import masked_whiten

__all__ = [
    "compute_gae",
    "compute_grpo",
    "compute_rae",
    "compute_reinforce_plus_plus",
    "compute_rloo",
    "discounted_returns",
    "episode_index",
    "group_index",
    "grpo_sequence_advantages",
    "rloo_sequence_advantages",
]


@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    valid: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016), multi-turn aware.

    Backwards over the masked-in tokens only (``t'`` = the next masked-in token after ``t``):

        delta_t = r_t + gamma * V_{t'} - V_t            (V_{t'} = 0 past the last masked-in token)
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t

    Mask-0 tokens are transparent: the next value and running advantage carry across them unchanged.

    Shapes: ``token_rewards, values, response_mask: [B, T]``. Returns ``(advantages, returns)``, both ``[B, T]``:
    advantages whitened over the mask (masked mean / unbiased std), returns from the un-whitened advantages;
    both 0 at mask-0 positions and on the rows of invalid samples (``valid``, which leave the whitening).
    """
    _check_same_shape("token_rewards", token_rewards, values=values, response_mask=response_mask)
    m = _valid_tokens(_bool(response_mask), valid)
    dtype = torch.promote_types(_float_dtype(token_rewards), _float_dtype(values))
    gamma, lam = _check_discount("gamma", gamma), _check_discount("lam", lam)
    # Drop the mask-0 tokens (compact each row), run plain GAE there, put the results back: observation tokens are
    # then transparent by construction. In compact form the next value is the right neighbour (0 past the end).
    compact_pos, dump_index, width = _compact_layout(m)
    scan_dtype = torch.promote_types(_scan_dtype(token_rewards), _scan_dtype(values))
    r = _to_compact(token_rewards, dump_index, width, scan_dtype)
    v = _to_compact(values, dump_index, width, scan_dtype)
    v_next = torch.nn.functional.pad(v[:, 1:], (0, 1))
    delta = r + gamma * v_next - v
    adv_c = _reverse_discounted_cumsum(delta, gamma * lam)
    adv = _from_compact(adv_c, m, compact_pos).to(dtype)
    returns = torch.where(m, adv + values.to(dtype), torch.zeros((), dtype=dtype, device=adv.device))
    return masked_whiten(adv, m), returns


@torch.no_grad()
def compute_grpo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Any,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
    valid: Any = None,
    episode_ids: Any = None,
) -> torch.Tensor:
    """GRPO outcome advantage (Shao et al. 2024); ``norm_by_std=False`` is Dr. GRPO (Liu et al. 2025).

        s_i   = sum_t r_{i,t} * mask_{i,t}
        A_i   = (s_i - mean_{g(i)}) / (std_{g(i)} + epsilon)      (norm_by_std)
        A_i   = s_i - mean_{g(i)}                                  (Dr. GRPO)
        A_i,t = A_i * mask_{i,t}

    ``std`` is unbiased; mean and std run over the group's valid members (``valid``, ``[B]`` bool; default all);
    invalid samples and groups with fewer than two valid members get 0. Shapes: ``token_rewards,
    response_mask: [B, T]``, ``group_ids``: B hashable labels (list / numpy array / tensor). Returns ``[B, T]``.

    Turn samples (``episode_ids``: B labels, the rows of one episode share one): ``s_e`` = the sum of ``s_i`` over
    the episode's rows, the group statistics run over episodes, and each row gets its episode's ``A_e``.
    """
    _check_same_shape("token_rewards", token_rewards, response_mask=response_mask)
    m = _bool(response_mask)
    dtype = _float_dtype(token_rewards)
    scores = _sequence_scores(token_rewards, m, dtype)
    if episode_ids is None:
        return _broadcast(grpo_sequence_advantages(scores, group_ids, epsilon, norm_by_std, valid), m)
    pooled, groups, ep_valid, eid, _ = _pooled_scores(scores, group_ids, valid, episode_ids)
    return _broadcast(grpo_sequence_advantages(pooled, groups, epsilon, norm_by_std, ep_valid)[eid], m)


@torch.no_grad()
def grpo_sequence_advantages(
    scores: torch.Tensor, group_ids: Any, epsilon: float = 1e-6, norm_by_std: bool = True, valid: Any = None
) -> torch.Tensor:
    """The grouping step of GRPO: ``[B]`` sequence scores -> ``[B]`` advantages ``(s - mean_g) / (std_g + eps)``.

    Unbiased std over the valid members; ``norm_by_std=False`` gives ``s - mean_g``; invalid samples and groups
    with fewer than two valid members get 0.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [B], got shape {tuple(scores.shape)}")
    gid, G = group_index(group_ids, scores.shape[0], scores.device)
    v = _valid_rows(valid, scores.shape[0], scores.device)
    return _group_normalise(scores.to(_float_dtype(scores)), gid, G, epsilon, norm_by_std, v)


def compute_rae(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    roles: Any,
    valid: Any = None,
    episode_ids: Any = None,
) -> torch.Tensor:
    """Role-conditioned advantage estimation (RAE; SPIRAL, Liu et al. 2025): a baseline per role, a role being a
    game and a seat, so that the seat a game favours does not read as a good policy.

        s_i   = sum_t r_{i,t} * mask_{i,t}
        b_r   = mean of s_j over the batch's valid samples j of role r
        A_i   = s_i - b_{role(i)}
        A_i,t = A_i * mask_{i,t}

    SPIRAL keeps ``b_r`` as a moving average over steps; here it is the batch's mean (the average's decay 0), which
    keeps the estimator stateless, so a resumed run computes what an uninterrupted one does. ``roles``: B hashable
    labels (None counts as one role of its own); a role with fewer than two valid samples gets 0. ``valid`` and
    ``episode_ids`` as in :func:`compute_grpo`. Shapes: ``token_rewards, response_mask: [B, T]``; returns ``[B, T]``.
    """
    labels = ["" if r is None else r for r in roles]
    return compute_grpo(token_rewards, response_mask, labels, norm_by_std=False, valid=valid,
                        episode_ids=episode_ids)


@torch.no_grad()
def compute_rloo(token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: Any,
                 valid: Any = None, episode_ids: Any = None) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024): each score minus the mean of the *other* scores in its group.

        s_i = sum_t r_{i,t} * mask_{i,t}
        A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1) = n_g / (n_g - 1) * (s_i - mean_g)

    ``n_g`` and the sums count the valid members only (``valid``, ``[B]`` bool; default all); invalid samples and
    groups with fewer than two valid members get 0. Shapes: ``[B, T]`` in, ``group_ids`` B labels; returns
    ``[B, T]`` (``A_i * mask``). Turn samples (``episode_ids``): pooled per episode as in :func:`compute_grpo`.
    """
    _check_same_shape("token_rewards", token_rewards, response_mask=response_mask)
    m = _bool(response_mask)
    dtype = _float_dtype(token_rewards)
    scores = _sequence_scores(token_rewards, m, dtype)
    if episode_ids is None:
        return _broadcast(rloo_sequence_advantages(scores, group_ids, valid), m)
    pooled, groups, ep_valid, eid, _ = _pooled_scores(scores, group_ids, valid, episode_ids)
    return _broadcast(rloo_sequence_advantages(pooled, groups, ep_valid)[eid], m)


@torch.no_grad()
def rloo_sequence_advantages(scores: torch.Tensor, group_ids: Any, valid: Any = None) -> torch.Tensor:
    """The grouping step of RLOO: ``[B]`` scores -> ``[B]`` advantages ``(n_g * s - sum_g) / (n_g - 1)``.

    Over valid members only; invalid samples and groups with fewer than two valid members get 0.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [B], got shape {tuple(scores.shape)}")
    out_dtype = _float_dtype(scores)
    scores = scores.to(torch.float64)  # n * s - sum cancels; float64 keeps it exact enough
    gid, G = group_index(group_ids, scores.shape[0], scores.device)
    v = _valid_rows(valid, scores.shape[0], scores.device)
    w = torch.ones_like(scores) if v is None else v.to(scores.dtype)
    counts = torch.zeros(G, dtype=scores.dtype, device=scores.device).index_add_(0, gid, w)
    sums = torch.zeros(G, dtype=scores.dtype, device=scores.device).index_add_(0, gid, scores * w)
    n = counts[gid]
    adv = torch.where((n > 1) & (w > 0), (n * scores - sums[gid]) / (n - 1).clamp_min(1), torch.zeros_like(scores))
    return adv.to(out_dtype)


@torch.no_grad()
def compute_reinforce_plus_plus(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, valid: Any = None
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): whitened discounted return-to-go.

        G_t = r_t + gamma * G_{t'}     (t' = next masked-in token; mask-0 tokens are skipped, not discounted)
        A   = masked_whiten(G, mask)

    Shapes: ``[B, T]`` in, ``[B, T]`` out, 0 at mask-0 positions and on invalid samples' rows (``valid``, which
    leave the whitening statistics).
    """
    _check_same_shape("token_rewards", token_rewards, response_mask=response_mask)
    m = _valid_tokens(_bool(response_mask), valid)
    return masked_whiten(discounted_returns(token_rewards, m, gamma), m)
