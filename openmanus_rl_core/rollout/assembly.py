"""Episodes into a training :class:`~openmanus_rl_core.batch.Batch`, with the reward placed on tokens by the allocator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openmanus_rl_core.rollout.episode import Episode


def build_batch(episodes: Sequence[Episode], breakdowns: Sequence[Any] | None, allocator: Callable[..., Any],
                pad_token_id: int, keep_env_errors: bool = False):
    """Stack episodes into a :class:`~openmanus_rl_core.batch.Batch` for the trainer.

    Shapes (``B`` episodes, ``P`` longest prompt, ``R`` longest response, at least 1):

    - ``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``input_ids`` = cat [B, P+R] (long);
    - ``attention_mask`` [B, P+R] (1 on real tokens), ``position_ids`` = clamp(cumsum(attention_mask) - 1, 0);
    - ``response_mask`` [B, R] float: 1 on generated tokens; all 0 for ``env_error`` episodes unless
      ``keep_env_errors``;
    - ``valid`` [B] bool: False for those excluded ``env_error`` episodes, which leave the advantage estimators'
      group statistics too (not only the loss);
    - ``rollout_log_probs`` [B, R] float: the engine's log-probs (0 off the mask);
    - ``token_level_scores`` [B, R] float: ``allocator(total, turn_rewards, segments, response_length)``;
    - ``step_ids`` [B, R] long: the turn index on each turn's reply tokens, -1 elsewhere.

    non_tensors: ``group_ids``, ``uid`` (unique per sample), ``anchor_obs`` (per sample: the observation each turn
    acted on), ``step_rewards`` (per sample: ``breakdown.turn_rewards``), ``success``, ``termination``,
    ``num_turns``, ``task_id``, ``reward`` (composed total), ``reward_parts``. ``breakdowns=None``: the env's own
    rewards (total = sum of step rewards, turn rewards = step rewards).
    """
    import torch

    from openmanus_rl_core.batch import Batch

    B = len(episodes)
    if B == 0:
        raise ValueError("build_batch got no episodes")
    if breakdowns is not None and len(breakdowns) != B:
        raise ValueError(f"build_batch got {len(breakdowns)} reward breakdowns for {B} episodes")
    P = max(1, max(len(e.prompt_ids) for e in episodes))
    R = max(1, max(len(e.response_ids) for e in episodes))
    prompts = torch.full((B, P), int(pad_token_id), dtype=torch.long)
    responses = torch.full((B, R), int(pad_token_id), dtype=torch.long)
    prompt_attn = torch.zeros((B, P), dtype=torch.long)
    resp_attn = torch.zeros((B, R), dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.float32)
    logp = torch.zeros((B, R), dtype=torch.float32)
    scores = torch.zeros((B, R), dtype=torch.float32)
    step_ids = torch.full((B, R), -1, dtype=torch.long)
    valid = torch.ones(B, dtype=torch.bool)
    totals, parts, step_rewards = [], [], []
    for i, ep in enumerate(episodes):
        traj = ep.trajectory
        p, r = len(ep.prompt_ids), len(ep.response_ids)
        valid[i] = traj.termination != "env_error" or keep_env_errors
        if p:
            prompts[i, P - p:] = torch.as_tensor(ep.prompt_ids, dtype=torch.long)
            prompt_attn[i, P - p:] = 1
        if r:
            responses[i, :r] = torch.as_tensor(ep.response_ids, dtype=torch.long)
            resp_attn[i, :r] = 1
            logp[i, :r] = torch.as_tensor(ep.logprobs, dtype=torch.float32)
            if valid[i]:
                mask[i, :r] = torch.as_tensor(ep.response_mask, dtype=torch.float32)
            step_ids[i, :r] = torch.as_tensor(ep.step_ids, dtype=torch.long)
        if breakdowns is not None:
            bd = breakdowns[i]
            total, turn_rewards, part = float(bd.total), [float(x) for x in bd.turn_rewards], dict(bd.parts)
        else:
            total, turn_rewards, part = traj.env_reward, [float(t.reward) for t in traj.turns], {}
        alloc = list(allocator(total, turn_rewards, traj.segments, r)) if r else []
        if len(alloc) != r:
            raise ValueError(f"allocator returned {len(alloc)} values for a response of {r} tokens")
        if r:
            scores[i, :r] = torch.as_tensor(alloc, dtype=torch.float32)
        totals.append(total)
        parts.append(part)
        step_rewards.append(turn_rewards)
    attention_mask = torch.cat([prompt_attn, resp_attn], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": mask,
        "rollout_log_probs": logp,
        "token_level_scores": scores,
        "step_ids": step_ids,
        "valid": valid,
    }
    non_tensors = {
        "group_ids": [e.group_id for e in episodes],
        "uid": [e.uid for e in episodes],
        "anchor_obs": [list(e.anchor_obs) for e in episodes],
        "step_rewards": step_rewards,
        "success": [bool(e.trajectory.success) for e in episodes],
        "termination": [e.trajectory.termination for e in episodes],
        "num_turns": [e.trajectory.num_turns for e in episodes],
        "task_id": [e.trajectory.task_id for e in episodes],
        "reward": totals,
        "reward_parts": parts,
    }
    return Batch(tensors=tensors, non_tensors=non_tensors, meta={"pad_token_id": int(pad_token_id)})

