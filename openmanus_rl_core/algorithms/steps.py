"""Advantages per turn of a multi-turn episode: GiGPO (a group's turns at the same state, on top of GRPO over its
episodes) and the per-state baseline (each turn against the batch's other turns at the same state and role).

Both read, per sample, the observation each turn acted on (``anchor_obs``) and each turn's reward
(``step_rewards``), and put each turn's advantage on its reply's tokens through ``step_ids`` (``[B, T]``: the turn
of each token, -1 off-turn). Conventions as in :mod:`.advantages`: pure kernels, tensors and labels in, tensors
out; ``valid`` samples only in the statistics; turn samples (``episode_ids``) pooled into their episodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain
from typing import Any

import torch

from .discounting import _reverse_discounted_cumsum
from .grouping import (_bool, _check_discount, _check_same_shape, _factorize_table, _float_dtype, _group_normalise,
                       _numbers_tensor, _pooled_scores, _sequence_scores, _take, _valid_rows, episode_index,
                       group_index)

__all__ = ["compute_gigpo", "compute_state_baseline", "gigpo_step_advantages"]


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


def _turns_to_tokens(turn_values: torch.Tensor, num_steps: torch.Tensor, step_ids: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` per-turn values onto the tokens of each turn: ``[B, T]``, where ``step_ids`` (``[B, T]``) names
    each token's turn, -1 for tokens of no turn (they get 0). A turn past a row's ``num_steps`` raises."""
    if step_ids.is_floating_point():
        raise ValueError(f"step_ids must be an integer tensor, got dtype {step_ids.dtype}")
    step_ids = step_ids.to(device=turn_values.device, dtype=torch.long)
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
    return torch.gather(torch.nn.functional.pad(turn_values, (1, 0)), 1, step_ids + 1)


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
    token_step_adv = _turns_to_tokens(step_adv, num_steps, step_ids)
    adv = torch.add(episode_adv.unsqueeze(1), token_step_adv, alpha=step_weight)
    keep = m if v is None else m & v.unsqueeze(1)
    return torch.where(keep, adv, torch.zeros((), dtype=dtype, device=device))


@torch.no_grad()
def compute_state_baseline(
    response_mask: torch.Tensor,
    step_ids: torch.Tensor,
    step_rewards: torch.Tensor | Sequence[Sequence[float]],
    anchor_obs: torch.Tensor | Sequence[Sequence[Hashable]],
    roles: Any,
    gamma: float = 1.0,
    valid: Any = None,
    episode_ids: Any = None,
) -> torch.Tensor:
    """Monte Carlo advantages with a per-state baseline: each turn's return against the mean return of every other
    turn in the batch that acted on the same observation in the same role (a game's information state and seat).

        G_{i,k} = sum_{k' >= k} gamma^(k'-k) r_{i,k'}                          (the turn's return)
        b_{i,k} = mean of G_{j,k'} over the batch's other turns (j, k') != (i, k) with
                  anchor_obs_{j,k'} = anchor_obs_{i,k} and role(j) = role(i)    (leave-one-out)
                  where the batch saw that state once: the same over the role's turns with index k' = k
        A_{i,t} = G_{i,k} - b_{i,k} on the tokens of turn k (step_ids_{i,t} = k), 0 elsewhere

    A turn with no other turn of its state or of its index gets 0. No std division: the returns keep their units
    (a poker game's chips). Where GRPO compares the games of one task (in self-play, one deal: a deterministic
    policy plays them alike and learns nothing) and RAE compares a seat's games across the batch whatever their
    cards, this compares what was done at the same state, across tasks, so each move is credited against the other
    moves made there. Inputs as in :func:`compute_gigpo` (``roles``: B hashable labels, None counting as one role),
    without ``group_ids``. Returns ``[B, T]``.
    """
    m = _bool(response_mask)
    dtype = _float_dtype(response_mask)
    device = response_mask.device
    B = m.shape[0]
    labels = ["" if r is None else r for r in roles]
    sample_valid = _valid_rows(valid, B, device)
    row_episode = None
    if episode_ids is not None:  # turn samples: the statistics run over episodes, each turn counted once
        row_episode, _, first = episode_index(episode_ids, B, device)
        step_rewards, anchor_obs, labels = _take(step_rewards, first), _take(anchor_obs, first), _take(labels, first)
        sample_valid = None if sample_valid is None else sample_valid[first]
    rid, R = group_index(labels, len(labels), device)
    codes, rewards, steps = _step_inputs(anchor_obs, step_rewards, len(labels), device)
    counted = steps if sample_valid is None else steps & sample_valid.unsqueeze(1)
    E, S = codes.shape
    adv = torch.zeros(E * S, dtype=torch.float64, device=device)
    if S:
        returns = _reverse_discounted_cumsum(rewards, _check_discount("gamma", gamma)).flatten()
        w = counted.flatten().to(torch.float64)
        done = torch.zeros(E * S, dtype=torch.bool, device=device)
        turn = torch.arange(S, device=device).expand(E, S)
        for key in (codes * R + rid.unsqueeze(1), turn * R + rid.unsqueeze(1)):  # the state, then the turn index
            key, K = group_index(key.flatten(), E * S, device)
            counts = torch.zeros(K, dtype=torch.float64, device=device).index_add_(0, key, w)
            sums = torch.zeros_like(counts).index_add_(0, key, returns * w)
            others = counts[key] - w
            use = (w > 0) & (others > 0) & ~done
            adv = torch.where(use, returns - (sums[key] - returns * w) / others.clamp_min(1), adv)
            done |= use
    adv, num_steps = adv.view(E, S), steps.sum(-1)
    if row_episode is not None:
        adv, num_steps = adv[row_episode], num_steps[row_episode]
    token_adv = _turns_to_tokens(adv, num_steps, step_ids)
    return torch.where(m, token_adv, torch.zeros((), dtype=torch.float64, device=device)).to(dtype)
