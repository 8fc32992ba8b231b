"""Excluded samples (``valid`` False: an env_error episode, a padding row) leave every estimator's statistics.

One batch for every estimator, values computed by hand below. Five samples, two tokens each, the reward on the
last token, ``response_mask`` all ones (so only ``valid`` excludes):

    row  group  reward  valid
    0    a      1.0     yes
    1    a      3.0     yes
    2    a      0.0     no     (an env_error: it must not move group a's mean or std)
    3    b      8.0     yes    (alone among group b's valid members: advantage 0 in group estimators)
    4    b      0.0     no
"""

from __future__ import annotations

import math

import pytest
import torch

from openmanus_rl_core.algorithms.advantages import (
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
)
from openmanus_rl_core.algorithms.steps import compute_gigpo
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.plugin.registry import registry

REWARDS = [1.0, 3.0, 0.0, 8.0, 0.0]
GROUPS = ["a", "a", "a", "b", "b"]
VALID = torch.tensor([True, True, False, True, False])


def _inputs():
    rewards = torch.zeros(5, 2)
    rewards[:, 1] = torch.tensor(REWARDS)
    return rewards, torch.ones(5, 2)


def _per_row(adv: torch.Tensor) -> list[float]:
    """The advantage of each row (GRPO-style estimators put the same value on each of a row's tokens)."""
    assert torch.allclose(adv[:, 0], adv[:, 1])
    return adv[:, 1].tolist()


def test_grpo_mean_and_std_over_valid_members_only():
    # group a's valid scores [1, 3]: mean 2, unbiased std sqrt(2); group b has one valid member -> 0
    r, m = _inputs()
    adv = compute_grpo(r, m, GROUPS, epsilon=0.0, valid=VALID)
    assert _per_row(adv) == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0, 0.0])
    # Without the flags the env_error's 0 joins group a: mean 4/3, std sqrt(7/3) -> row 0 gets -0.2182
    assert _per_row(compute_grpo(r, m, GROUPS, epsilon=0.0))[0] == pytest.approx(-(1 / 3) / math.sqrt(7 / 3))


def test_dr_grpo_and_rloo_over_valid_members_only():
    r, m = _inputs()
    assert _per_row(compute_grpo(r, m, GROUPS, norm_by_std=False, valid=VALID)) == pytest.approx(
        [-1.0, 1.0, 0.0, 0.0, 0.0])  # s - mean over {1, 3}
    # RLOO: s_i minus the mean of the OTHER valid members: 1 - 3, 3 - 1
    assert _per_row(compute_rloo(r, m, GROUPS, valid=VALID)) == pytest.approx([-2.0, 2.0, 0.0, 0.0, 0.0])


def test_gigpo_both_levels_over_valid_members_only():
    # One step per sample, all on the same anchor state: the step group equals the episode group, so each level
    # gives -+1/sqrt(2) in group a and the sum is -+sqrt(2).
    r, m = _inputs()
    step_ids = torch.tensor([[-1, 0]] * 5)
    adv = compute_gigpo(r, m, GROUPS, step_ids, [[x] for x in REWARDS], [["s0"]] * 5, gamma=1.0, epsilon=0.0,
                        valid=VALID)
    assert adv[:, 1].tolist() == pytest.approx([-math.sqrt(2), math.sqrt(2), 0.0, 0.0, 0.0])
    assert adv[:, 0].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0, 0.0])


@pytest.mark.parametrize("estimator", ["gae", "reinforce_plus_plus"])
def test_whitening_over_valid_tokens_only(estimator):
    # gamma = lam = 1, values 0: each valid row's two tokens carry its reward (the return-to-go).
    # Valid tokens [1, 1, 3, 3, 8, 8]: mean 4, unbiased var 52/5; excluded rows are 0.
    r, m = _inputs()
    if estimator == "gae":
        adv, _ = compute_gae(r, torch.zeros_like(r), m, gamma=1.0, lam=1.0, valid=VALID)
    else:
        adv = compute_reinforce_plus_plus(r, m, gamma=1.0, valid=VALID)
    std = math.sqrt(52 / 5 + 1e-8)
    assert _per_row(adv) == pytest.approx([-3 / std, 1 * -1 / std, 0.0, 4 / std, 0.0], abs=1e-5)


@pytest.mark.parametrize("name", ["grpo", "grpo_no_std", "rloo", "gigpo", "reinforce_plus_plus", "gae", "rae"])
def test_registered_estimators_read_the_batch_valid_flags(name):
    r, m = _inputs()
    batch = Batch(tensors={"token_level_rewards": r, "response_mask": m, "values": torch.zeros_like(r),
                           "step_ids": torch.tensor([[-1, 0]] * 5), "valid": VALID},
                  non_tensors={"group_ids": GROUPS, "roles": GROUPS, "anchor_obs": [["s0"]] * 5,
                               "step_rewards": [[x] for x in REWARDS]})
    adv, _ = registry("advantage").get(name)(batch)
    assert adv[~VALID].abs().sum().item() == 0.0  # excluded rows get nothing
    assert adv[0, 1].item() < adv[1, 1].item()  # the better-rewarded sample gets more
    # Flipping an excluded row's reward changes nothing: it is not part of any statistic.
    r2 = r.clone()
    r2[2, 1] = -50.0
    batch["token_level_rewards"] = r2
    adv2, _ = registry("advantage").get(name)(batch)
    assert torch.allclose(adv, adv2)
