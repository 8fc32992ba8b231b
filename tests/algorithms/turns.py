"""A batch of multi-turn episodes for the per-turn estimators' tests."""

from __future__ import annotations

import torch

from openmanus_rl_core.batch import Batch


def turn_batch(step_rewards, anchor_obs, roles, turn_tokens=2, **non_tensors) -> Batch:
    """One row an episode: each turn ``turn_tokens`` reply tokens, then one observation token (step id -1)."""
    B, S = len(anchor_obs), max(map(len, anchor_obs))
    step_ids = torch.full((B, S * (turn_tokens + 1)), -1, dtype=torch.long)
    for i, obs in enumerate(anchor_obs):
        for k in range(len(obs)):
            step_ids[i, k * (turn_tokens + 1):k * (turn_tokens + 1) + turn_tokens] = k
    mask = (step_ids >= 0).float()
    return Batch(tensors={"response_mask": mask, "step_ids": step_ids},
                 non_tensors={"step_rewards": step_rewards, "anchor_obs": anchor_obs, "roles": roles, **non_tensors})
