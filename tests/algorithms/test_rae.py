"""Role-conditioned advantages (``rae``): a baseline per role (a game and a seat), the batch's mean return of that
role, so a seat the game favours does not read as a better policy."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.algorithms import compute_grpo, compute_rae
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.plugin.registry import registry


def test_rae_subtracts_each_roles_mean_return():
    estimator = registry("advantage").get("rae")
    scores = torch.tensor([2.0, -2.0, 1.0, -1.0, 1.0, 3.0])
    mask = torch.tensor([[1, 1, 0]] * 6, dtype=torch.float32)
    rewards = torch.zeros(6, 3)
    rewards[:, 1] = scores
    roles = ["k:seat0", "k:seat1", "k:seat0", "k:seat1", "l:seat0", None]
    batch = Batch(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"roles": roles})
    adv, returns = estimator(batch)
    per_row = adv[:, 0]
    # seat0 of k: mean 1.5; seat1 of k: mean -1.5; l:seat0 and the unnamed role have one sample each: 0
    assert per_row.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])
    assert torch.equal(adv[:, 2], torch.zeros(6)) and torch.equal(adv, returns)
    grpo = registry("advantage").get("grpo")(Batch(tensors={"token_level_rewards": rewards, "response_mask": mask},
                                                   non_tensors={"group_ids": ["g"] * 6}))[0][:, 0]
    assert not torch.allclose(grpo, per_row)  # one baseline for every seat would not be this




def test_rae_pools_the_turn_rows_of_an_episode_and_skips_invalid_rows():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 5.0], [0.0, -1.0], [0.0, 9.0]])
    mask = torch.ones(5, 2)
    roles = ["a", "a", "a", "a", "a"]
    episodes = ["e0", "e0", "e1", "e2", "e3"]  # e0's two turn rows score 3 together
    valid = torch.tensor([True, True, True, True, False])
    adv = compute_rae(rewards, mask, roles, valid=valid, episode_ids=episodes)
    # episodes e0 (3), e1 (5), e2 (-1): mean 7/3; e3 is not valid and gets 0
    assert adv[:, 0].tolist() == pytest.approx([3 - 7 / 3, 3 - 7 / 3, 5 - 7 / 3, -1 - 7 / 3, 0.0])
    same = compute_grpo(rewards, mask, roles, norm_by_std=False, valid=valid, episode_ids=episodes)
    assert torch.allclose(adv, same)  # with one role, RAE is Dr. GRPO over the batch
