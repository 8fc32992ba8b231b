"""Episodes into a training :class:`~openmanus_rl_core.batch.Batch`, with the reward placed on tokens by the allocator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openmanus_rl_core.rollout.episode import Episode


def build_batch(episodes: Sequence[Episode], breakdowns: Sequence[Any] | None, allocator: Callable[..., Any],
                pad_token_id: int, keep_env_errors: bool = False):
    """Stack episodes into a :class:`~openmanus_rl_core.batch.Batch` for the trainer: one row per episode, or,
    for an episode of a per-turn memory (``Episode.contexts``), one row per turn (prompt = that turn's context,
    response = that turn's reply with the engine's log-probs, scores = the allocator's values over the episode's
    replies back to back, sliced to the turn).

    Shapes (``B`` rows, ``P`` longest prompt, ``R`` longest response, at least 1):

    - ``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``input_ids`` = cat [B, P+R] (long);
    - ``attention_mask`` [B, P+R] (1 on real tokens), ``position_ids`` = clamp(cumsum(attention_mask) - 1, 0);
    - ``response_mask`` [B, R] float: 1 on generated tokens; all 0 for ``env_error`` episodes unless
      ``keep_env_errors``;
    - ``valid`` [B] bool: False for those excluded ``env_error`` episodes, which leave the advantage estimators'
      group statistics too (not only the loss);
    - ``rollout_log_probs`` [B, R] float: the engine's log-probs (0 off the mask);
    - ``token_level_scores`` [B, R] float: ``allocator(total, turn_rewards, segments, response_length)``;
    - ``step_ids`` [B, R] long: the turn index on each turn's reply tokens, -1 elsewhere;
    - ``versions`` [B, R] long: the policy version that generated each response token (``Episode.versions``), -1
      elsewhere.
    - ``choice_ids`` [B, R, K] long and ``forced`` [B, R] float, only when some reply was decoded under a
      constraint (``Episode.choices``): the tokens the grammar allowed at each of its positions (-1 padding; all -1
      elsewhere), over which the actor renormalises the model's distribution there (``workers/logprobs.py``), and 1
      where it allowed one token only. Forced tokens stay in ``response_mask`` (the reward allocated to a reply's
      last token is summed over it) and leave the actor's loss
      (:func:`~openmanus_rl_core.run.worker_inputs.actor_batch`).

    non_tensors (per row, the episode's values): ``group_ids``, ``uid`` (unique per sample), ``anchor_obs`` (the
    observation each turn acted on), ``step_rewards`` (``breakdown.turn_rewards``), ``success``, ``termination``,
    ``num_turns``, ``task_id``, ``data_source``, ``source`` (the task row's), ``roles`` (the trajectory's
    ``info["role"]``, e.g. a game seat, or None: the ``rae`` estimator's baseline key), ``invalid`` (the row's replies the
    template could not read), ``reward`` (composed total), ``reward_parts``; with turn samples also
    ``episode_ids`` (the episode's uid; the estimators pool its rows). A turn row's ``step_ids`` is its turn.
    ``breakdowns=None``: the env's own rewards (total = sum of step rewards, turn rewards = step rewards).
    """
    import torch

    from openmanus_rl_core.batch import Batch

    B = len(episodes)
    if B == 0:
        raise ValueError("build_batch got no episodes")
    if breakdowns is not None and len(breakdowns) != B:
        raise ValueError(f"build_batch got {len(breakdowns)} reward breakdowns for {B} episodes")
    rows = []  # (episode index, prompt ids, response slice [s, e), uid)
    turns_of: dict[str, tuple[int, int]] = {}  # a sample's uid -> its turns [first, last + 1)
    for i, ep in enumerate(episodes):
        for k, (prompt, span, turns) in enumerate(ep.samples()):
            uid = f"{ep.uid}:{k}" if ep.contexts else ep.uid
            rows.append((i, prompt, span, uid))
            turns_of[uid] = turns
    N = len(rows)
    P = max(1, max(len(p) for _, p, _, _ in rows))
    R = max(1, max(e - s for _, _, (s, e), _ in rows))
    prompts = torch.full((N, P), int(pad_token_id), dtype=torch.long)
    responses = torch.full((N, R), int(pad_token_id), dtype=torch.long)
    prompt_attn = torch.zeros((N, P), dtype=torch.long)
    resp_attn = torch.zeros((N, R), dtype=torch.long)
    mask = torch.zeros((N, R), dtype=torch.float32)
    logp = torch.zeros((N, R), dtype=torch.float32)
    scores = torch.zeros((N, R), dtype=torch.float32)
    step_ids = torch.full((N, R), -1, dtype=torch.long)
    versions = torch.full((N, R), -1, dtype=torch.long)
    valid = torch.ones(N, dtype=torch.bool)
    K = max((len(a) for ep in episodes for a in ep.choices.values()), default=0)
    choice_ids = torch.full((N, R, K), -1, dtype=torch.long) if K else None
    forced = torch.zeros((N, R), dtype=torch.float32) if K else None
    totals, parts, step_rewards, allocs = [], [], [], []
    for ep, bd in zip(episodes, breakdowns if breakdowns is not None else [None] * B):
        traj = ep.trajectory
        if bd is not None:
            total, turn_rewards, part = float(bd.total), [float(x) for x in bd.turn_rewards], dict(bd.parts)
        else:
            total, turn_rewards, part = traj.env_reward, [float(t.reward) for t in traj.turns], {}
        r = len(ep.response_ids)
        alloc = list(allocator(total, turn_rewards, traj.segments, r)) if r else []
        if len(alloc) != r:
            raise ValueError(f"allocator returned {len(alloc)} values for a response of {r} tokens")
        totals.append(total)
        parts.append(part)
        step_rewards.append(turn_rewards)
        allocs.append(alloc)
    for j, (i, prompt, (s, e), _) in enumerate(rows):
        ep = episodes[i]
        p, r = len(prompt), e - s
        valid[j] = ep.trajectory.termination != "env_error" or keep_env_errors
        if p:
            prompts[j, P - p:] = torch.as_tensor(prompt, dtype=torch.long)
            prompt_attn[j, P - p:] = 1
        if r:
            responses[j, :r] = torch.as_tensor(ep.response_ids[s:e], dtype=torch.long)
            resp_attn[j, :r] = 1
            logp[j, :r] = torch.as_tensor(ep.logprobs[s:e], dtype=torch.float32)
            if valid[j]:
                mask[j, :r] = torch.as_tensor(ep.response_mask[s:e], dtype=torch.float32)
            step_ids[j, :r] = torch.as_tensor(ep.step_ids[s:e], dtype=torch.long)
            tagged = ep.versions[s:e]  # an episode that records no versions keeps -1
            versions[j, :len(tagged)] = torch.as_tensor(tagged, dtype=torch.long)
            scores[j, :r] = torch.as_tensor(allocs[i][s:e], dtype=torch.float32)
            if choice_ids is not None:
                for k, allowed in ep.choices.items():
                    if s <= k < e:
                        choice_ids[j, k - s, :len(allowed)] = torch.as_tensor(allowed, dtype=torch.long)
                        forced[j, k - s] = float(len(allowed) == 1)
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
        "versions": versions,
        "valid": valid,
    }
    if choice_ids is not None:
        tensors["choice_ids"], tensors["forced"] = choice_ids, forced
    of = [i for i, _, _, _ in rows]
    non_tensors = {
        "group_ids": [episodes[i].group_id for i in of],
        "uid": [uid for _, _, _, uid in rows],
        "anchor_obs": [list(episodes[i].anchor_obs) for i in of],
        "step_rewards": [step_rewards[i] for i in of],
        "success": [bool(episodes[i].trajectory.success) for i in of],
        "termination": [episodes[i].trajectory.termination for i in of],
        "num_turns": [episodes[i].trajectory.num_turns for i in of],
        "task_id": [episodes[i].trajectory.task_id for i in of],
        "data_source": [episodes[i].trajectory.task.get("data_source") for i in of],
        "source": [episodes[i].trajectory.task.get("source") for i in of],
        "task_row": [episodes[i].trajectory.task.get("task_row") for i in of],  # which task row: the dumps name it
        "seed": [episodes[i].trajectory.task.get("seed") for i in of],
        "roles": [episodes[i].trajectory.info.get("role") for i in of],
        "invalid": [_invalid(episodes[i].trajectory, turns_of[uid]) for i, _, _, uid in rows],
        "reward": [totals[i] for i in of],
        "reward_parts": [parts[i] for i in of],
    }
    if any(ep.contexts for ep in episodes):  # turn samples: the estimators pool each episode's rows
        non_tensors["episode_ids"] = [episodes[i].uid for i in of]
    return Batch(tensors=tensors, non_tensors=non_tensors, meta={"pad_token_id": int(pad_token_id)})


def _invalid(trajectory: Any, turns: tuple[int, int]) -> int:
    """How many of a row's replies (its turns ``[first, last + 1)``) the template could not read."""
    return sum(not turn.action.valid for turn in trajectory.turns[turns[0]:turns[1]])
