"""Advantage estimators: GAE, GRPO (and Dr. GRPO), RLOO, REINFORCE++ and GiGPO.

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

from collections.abc import Hashable, Sequence
from itertools import chain
from typing import Any

import torch

from .discounting import (_compact_layout, _from_compact, _reverse_discounted_cumsum, _scan_dtype, _to_compact,
                          discounted_returns)
from .grouping import (_bool, _broadcast, _check_discount, _check_same_shape, _factorize_table, _float_dtype,
                       _group_normalise, _numbers_tensor, _pooled_scores, _sequence_scores, _take, _valid_rows,
                       _valid_tokens, episode_index, group_index)
from .losses import masked_whiten

__all__ = [
    "compute_gae",
    "compute_gigpo",
    "compute_grpo",
    "compute_rae",
    "compute_reinforce_plus_plus",
    "compute_rloo",
    "discounted_returns",
    "episode_index",
    "gigpo_step_advantages",
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


def _step_inputs(
    anchor_obs: Any, step_rewards: Any, n: int, device: torch.device | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GiGPO step inputs -> ``(codes [B, S] long, rewards [B, S] float64, valid [B, S] bool)``.

    ``codes`` are dense ids of the anchor observations (-1 past a trajectory's last step); ``rewards`` are 0 there.
    """
    if isinstance(anchor_obs, torch.Tensor):
        if anchor_obs.dim() != 2 or anchor_obs.shape[0] != n:
            raise ValueError(f"anchor_obs tensor must be [B={n}, S], got shape {tuple(anchor_obs.shape)}")
        codes = anchor_obs.to(device=device, dtype=torch.long)
        valid = codes >= 0
        prefix = torch.arange(codes.shape[1], device=codes.device) < valid.sum(-1, keepdim=True)
        if not bool((valid == prefix).all()):
            raise ValueError("anchor_obs tensor: each row must hold its steps' ids first and -1 padding after")
        # Re-number the ids densely (0..K-1) so that joint (group, id) keys stay small.
        dense = torch.unique(codes[valid], return_inverse=True)[1]
        codes = torch.full_like(codes, -1).masked_scatter_(valid, dense)
    else:
        rows = list(anchor_obs)
        if len(rows) != n:
            raise ValueError(f"anchor_obs has {len(rows)} rows but the batch has {n} samples")
        row_types = set(map(type, rows))
        if str in row_types or bytes in row_types:
            bad = next(i for i, row in enumerate(rows) if isinstance(row, (str, bytes)))
            raise TypeError(f"anchor_obs[{bad}] is a single string; it must be the list of that sample's observations")
        lengths = torch.tensor(list(map(len, rows)), dtype=torch.long)
        width = int(lengths.max()) if n else 0
        valid = torch.arange(width) < lengths.unsqueeze(1)
        # One dict lookup per step maps observations (any hashable) to ids; the grouping itself is tensor ops.
        flat_obs = list(chain.from_iterable(rows))
        table = _factorize_table(flat_obs)
        codes = torch.full((n, width), -1, dtype=torch.long)
        codes.masked_scatter_(valid, _numbers_tensor(list(map(table.__getitem__, flat_obs)), torch.long))
        codes, valid = codes.to(device), valid.to(device)
    B, S = codes.shape

    if isinstance(step_rewards, torch.Tensor):
        if step_rewards.dim() != 2 or step_rewards.shape[0] != n or step_rewards.shape[1] < S:
            raise ValueError(
                f"step_rewards tensor must be [B={n}, S>={S}] (one reward per anchor observation), "
                f"got shape {tuple(step_rewards.shape)}"
            )
        rewards = step_rewards[:, :S].to(device=codes.device, dtype=torch.float64)
        rewards = torch.where(valid, rewards, torch.zeros((), dtype=torch.float64, device=codes.device))
    else:
        reward_rows = list(step_rewards)
        if len(reward_rows) != n:
            raise ValueError(f"step_rewards has {len(reward_rows)} rows but the batch has {n} samples")
        reward_lengths = torch.tensor(list(map(len, reward_rows)), dtype=torch.long, device=codes.device)
        mismatch = (reward_lengths != valid.sum(-1)).nonzero()
        if mismatch.numel():
            i = int(mismatch[0, 0])
            raise ValueError(
                f"sample {i} has {int(reward_lengths[i])} step rewards but {int(valid[i].sum())} anchor observations; "
                "give one reward per step"
            )
        rewards = torch.zeros(B, S, dtype=torch.float64)
        rewards.masked_scatter_(valid.cpu(), _numbers_tensor(list(chain.from_iterable(reward_rows)), torch.float64))
        rewards = rewards.to(codes.device)
    return codes, rewards, valid


@torch.no_grad()
def gigpo_step_advantages(
    group_ids: Any,
    step_rewards: torch.Tensor | Sequence[Sequence[float]],
    anchor_obs: torch.Tensor | Sequence[Sequence[Hashable]],
    gamma: float = 0.95,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
    valid: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step level of GiGPO: per-step discounted returns normalised within anchor-state groups.

    ``G_{i,k} = sum_{k' >= k} gamma^(k'-k) r_{i,k'}``; the step group of ``(i, k)`` is every step of the same rollout
    group whose anchor observation equals ``anchor_obs[i][k]``; ``A_{i,k} = (G_{i,k} - mean) / (std + eps)``
    (unbiased std; singletons 0; the steps of invalid samples belong to no step group and get 0). Inputs as in
    ``compute_gigpo``. Returns ``(step_adv [B, S] float64, num_steps [B])``,
    ``step_adv`` 0 beyond each trajectory's ``num_steps``.
    """
    gamma = _check_discount("gamma", gamma)
    B = len(anchor_obs)
    # Results live where the first tensor input lives (group ids first: compute_gigpo passes them on the token device).
    device = next((x.device for x in (group_ids, anchor_obs, step_rewards) if isinstance(x, torch.Tensor)), None)
    gid, G = group_index(group_ids, B, device)
    codes, rewards, steps = _step_inputs(anchor_obs, step_rewards, B, gid.device)
    sample_valid = _valid_rows(valid, B, gid.device)
    # Steps of invalid samples join the padding: a group of their own whose result is discarded.
    valid = steps if sample_valid is None else steps & sample_valid.unsqueeze(1)
    S = codes.shape[1]
    step_adv = torch.zeros(B, S, dtype=torch.float64, device=gid.device)
    if S:
        # Steps are a prefix of each row and the padding rewards are 0, so the padding is transparent to the
        # backward recursion: no compaction needed.
        step_returns = _reverse_discounted_cumsum(rewards, gamma)
        # A step group is a (rollout group, anchor observation) pair: one joint integer key per step. Padding
        # steps get the extra key num_keys, a group of their own whose result is discarded.
        num_keys = (int(codes.max()) + 1) * G
        joint = torch.where(valid, codes * G + gid.unsqueeze(1), num_keys).flatten()
        if num_keys <= 4 * joint.numel():  # keys are dense enough to index the group statistics directly
            step_gid, num_step_groups = joint, num_keys + 1
        else:
            uniq, step_gid = torch.unique(joint, return_inverse=True)
            num_step_groups = int(uniq.numel())
        normalised = _group_normalise(step_returns.flatten(), step_gid, num_step_groups, epsilon, norm_by_std)
        step_adv = torch.where(valid, normalised.view(B, S), step_adv)
    return step_adv, steps.sum(-1)


@torch.no_grad()
def compute_gigpo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Any,
    step_ids: torch.Tensor,
    step_rewards: torch.Tensor | Sequence[Sequence[float]],
    anchor_obs: torch.Tensor | Sequence[Sequence[Hashable]],
    gamma: float = 0.95,
    step_weight: float = 1.0,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
    valid: Any = None,
    episode_ids: Any = None,
) -> torch.Tensor:
    """GiGPO: group-in-group policy optimisation (Feng et al. 2025) for multi-turn agents.

    Inputs (``B`` trajectories, ``T`` tokens, ``S`` = most steps in any trajectory):

    - ``token_rewards``, ``response_mask``: ``[B, T]``; ``group_ids``: B labels, trajectories of one task rollout group.
    - ``step_ids``: LongTensor ``[B, T]``, the turn (step index ``0..n_i-1``) each token belongs to, -1 for tokens of
      no agent turn (prompt, padding, observations).
    - ``step_rewards``: ``[B, S]`` float tensor, or B lists of per-step rewards (``n_i`` entries for sample ``i``).
    - ``anchor_obs``: B lists of the hashable observation (e.g. the str) each step acted on, ``n_i`` entries, or a
      LongTensor ``[B, S]`` of observation ids with -1 after the last step. ``n_i`` = the number of steps of ``i``.

    Advantages:

        episode:  s_i = sum_t r_{i,t} * mask_{i,t}
                  A^E_i = (s_i - mean_{g(i)}) / (std_{g(i)} + eps)               (GRPO over trajectories)
        step:     G_{i,k} = sum_{k' >= k} gamma^(k'-k) * step_rewards_{i,k'}   (discounted, per trajectory)
                  step group of (i, k) = all steps (j, k') with g(j) = g(i) and anchor_obs_{j,k'} = anchor_obs_{i,k}
                  A^S_{i,k} = (G_{i,k} - mean_stepgroup) / (std_stepgroup + eps)
        token:    A_{i,t} = (A^E_i + step_weight * A^S_{i, step_ids_{i,t}}) * mask_{i,t}
                  (the A^S term is 0 where step_ids = -1)

    A step group holds every step of the rollout group that acted on the same anchor observation, repeats of a state
    within one trajectory included. Singleton groups (episode or step) get 0; ``norm_by_std=False`` drops the std
    division at both levels. Invalid samples (``valid``, ``[B]`` bool) join no group at either level and get 0.
    Returns ``[B, T]``.

    Turn samples (``episode_ids``: B labels, the rows of one episode share one, and carry the episode's
    ``step_rewards`` and ``anchor_obs``): ``s_e`` sums the episode's rows, both levels run over episodes (each
    step counted once), and a row's tokens read ``A^E_e + step_weight * A^S_{e, step_ids}``.
    """
    _check_same_shape("token_rewards", token_rewards, response_mask=response_mask, step_ids=step_ids)
    if step_ids.is_floating_point():
        raise ValueError(f"step_ids must be an integer tensor, got dtype {step_ids.dtype}")
    m = _bool(response_mask)
    dtype = _float_dtype(token_rewards)
    device = token_rewards.device
    B = token_rewards.shape[0]
    scores = _sequence_scores(token_rewards, m, dtype)
    v = _valid_rows(valid, B, device)
    row_episode = None
    if episode_ids is not None:  # pool turn samples into episodes; both levels then run over episodes
        scores, group_ids, ep_valid, row_episode, first = _pooled_scores(scores, group_ids, v, episode_ids)
        step_rewards, anchor_obs = _take(step_rewards, first), _take(anchor_obs, first)
    else:
        ep_valid = v
    gid, G = group_index(group_ids, scores.shape[0], device)

    # Episode level: GRPO over whole trajectories.
    episode_adv = _group_normalise(scores, gid, G, epsilon, norm_by_std, ep_valid)

    # Step level.
    step_adv, num_steps = gigpo_step_advantages(
        gid, step_rewards, anchor_obs, gamma=gamma, epsilon=epsilon, norm_by_std=norm_by_std, valid=ep_valid
    )
    step_adv = step_adv.to(dtype)
    if row_episode is not None:
        episode_adv, step_adv, num_steps = episode_adv[row_episode], step_adv[row_episode], num_steps[row_episode]
    step_ids = step_ids.to(device=device, dtype=torch.long)
    lowest, highest = torch.aminmax(step_ids, dim=1) if step_ids.numel() else (num_steps * 0, num_steps * 0 - 1)
    if bool((highest >= num_steps).any()):
        bad = int((highest >= num_steps).nonzero()[0, 0])
        raise ValueError(
            f"step_ids of sample {bad} reach {int(highest[bad])} but it has {int(num_steps[bad])} "
            "anchor observations; step_ids must be in [-1, n_steps)"
        )
    if bool((lowest < -1).any()):
        raise ValueError("step_ids must be >= -1 (-1 marks tokens of no agent step)")

    # Column 0 of the padded table is a zero for step id -1, so one gather serves every token.
    table = torch.nn.functional.pad(step_adv, (1, 0))
    token_step_adv = torch.gather(table, 1, step_ids + 1)
    adv = torch.add(episode_adv.unsqueeze(1), token_step_adv, alpha=step_weight)
    keep = m if v is None else m & v.unsqueeze(1)
    return torch.where(keep, adv, torch.zeros((), dtype=dtype, device=device))
