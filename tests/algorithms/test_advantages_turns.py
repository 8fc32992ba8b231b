"""GRPO, RLOO and GiGPO over turn samples (one row per turn, ``episode_ids`` tie an episode's rows), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from openmanus_rl_core.algorithms import compute_gigpo, compute_grpo, compute_rloo, episode_index
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.plugin.registry import registry

# One group "g" of three episodes: E1 three turns (reward 1 on its last token), E2 two turns (0), E3 one turn (0.5).
# Rows hold two tokens; row 6 is an episode of another group "h" alone (a singleton group: advantage 0).
EPISODES = ["E1", "E1", "E1", "E2", "E2", "E3", "H1"]
GROUPS = ["g", "g", "g", "g", "g", "g", "h"]
TURN = [0, 1, 2, 0, 1, 0, 0]
REWARDS = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.5, 0.0], [3.0, 0.0]])
MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0], [1, 0]], dtype=torch.float32)
STEP_IDS = torch.tensor([[t, t] for t in TURN]) * MASK.long() + (MASK.long() - 1)
STEP_REWARDS = {"E1": [0.0, 0.0, 1.0], "E2": [0.0, 0.0], "E3": [0.5], "H1": [3.0]}
ANCHORS = {"E1": ["A", "B", "C"], "E2": ["A", "B"], "E3": ["A"], "H1": ["A"]}
EPS = 1e-6


def _rows(per_episode: dict) -> list:
    return [per_episode[e] for e in EPISODES]


def _per_row(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).unsqueeze(1) * MASK


def test_episode_index_maps_rows_to_episodes_in_first_seen_order():
    eid, E, first = episode_index(EPISODES, 7)
    assert eid.tolist() == [0, 0, 0, 1, 1, 2, 3] and E == 4 and first.tolist() == [0, 3, 5, 6]


def test_grpo_over_turn_samples_normalises_episode_returns_and_gives_each_row_its_episode_advantage():
    # Group g: episode returns 1, 0, 0.5 -> mean 0.5, unbiased std 0.5 -> A = +1, -1, 0 (divided by 0.5 + eps).
    a = 0.5 / (0.5 + EPS)
    adv = compute_grpo(REWARDS, MASK, GROUPS, epsilon=EPS, episode_ids=EPISODES)
    torch.testing.assert_close(adv, _per_row([a, a, a, -a, -a, 0.0, 0.0]))
    # Dr. GRPO: no std division.
    adv = compute_grpo(REWARDS, MASK, GROUPS, norm_by_std=False, episode_ids=EPISODES)
    torch.testing.assert_close(adv, _per_row([0.5, 0.5, 0.5, -0.5, -0.5, 0.0, 0.0]))
    # Rows taken as independent samples would give E1's first two rows a negative advantage: pooling matters.
    naive = compute_grpo(REWARDS, MASK, GROUPS, epsilon=EPS)
    assert float(naive[0, 0]) < 0


def test_an_invalid_episode_leaves_the_group_statistics():
    valid = torch.tensor([True, True, True, False, False, True, True])  # E2 ended as env_error
    adv = compute_grpo(REWARDS, MASK, GROUPS, epsilon=EPS, valid=valid, episode_ids=EPISODES)
    a = 0.25 / (math.sqrt(0.125) + EPS)  # E1 = 1, E3 = 0.5: mean 0.75, std sqrt(0.125)
    torch.testing.assert_close(adv, _per_row([a, a, a, 0.0, 0.0, -a, 0.0]))


def test_rloo_over_turn_samples_leaves_one_episode_out():
    # E1: 1 - (0 + 0.5) / 2 = 0.75; E2: 0 - 0.75 = -0.75; E3: 0.5 - 0.5 = 0.
    adv = compute_rloo(REWARDS, MASK, GROUPS, episode_ids=EPISODES)
    torch.testing.assert_close(adv, _per_row([0.75, 0.75, 0.75, -0.75, -0.75, 0.0, 0.0]))


def test_rloo_over_turn_samples_gives_an_env_error_episode_0_and_leaves_it_out_of_the_others_baseline():
    # E2 ended as env_error: E1 and E3 are each other's only baseline. E1: 1 - 0.5 = 0.5; E3: 0.5 - 1 = -0.5.
    # (With E2 kept in the baseline E1 would get 0.75 and E3 0.)
    valid = torch.tensor([True, True, True, False, False, True, True])
    adv = compute_rloo(REWARDS, MASK, GROUPS, valid=valid, episode_ids=EPISODES)
    torch.testing.assert_close(adv, _per_row([0.5, 0.5, 0.5, 0.0, 0.0, -0.5, 0.0]))


def test_gigpo_over_turn_samples_groups_steps_by_anchor_state_across_episodes():
    """Episode level as GRPO above (A^E = +1, -1, 0). Step level, gamma 1: returns E1 [1, 1, 1], E2 [0, 0], E3 [0.5].
    Anchor A holds E1/0, E2/0, E3/0 (1, 0, 0.5: +1, -1, 0); anchor B holds E1/1, E2/1 (1, 0: std sqrt(0.5), so
    +-0.5/sqrt(0.5)); anchor C holds E1/2 alone (0). H1 is alone in its group (0 at both levels)."""
    ae = 0.5 / (0.5 + EPS)
    b = 0.5 / (math.sqrt(0.5) + EPS)
    want = [ae + ae, ae + b, ae + 0.0, -ae - ae, -ae - b, 0.0, 0.0]
    adv = compute_gigpo(REWARDS, MASK, GROUPS, STEP_IDS, _rows(STEP_REWARDS), _rows(ANCHORS), gamma=1.0,
                        step_weight=1.0, epsilon=EPS, episode_ids=EPISODES)
    torch.testing.assert_close(adv, _per_row(want).to(adv.dtype))
    half = compute_gigpo(REWARDS, MASK, GROUPS, STEP_IDS, _rows(STEP_REWARDS), _rows(ANCHORS), gamma=1.0,
                         step_weight=0.5, epsilon=EPS, episode_ids=EPISODES)
    torch.testing.assert_close(half, _per_row([ae + ae / 2, ae + b / 2, ae, -ae - ae / 2, -ae - b / 2, 0.0, 0.0]))


def test_the_registered_rloo_estimator_pools_each_episodes_rows_when_given_episode_ids():
    batch = Batch(tensors={"token_level_rewards": REWARDS, "response_mask": MASK},
                  non_tensors={"group_ids": GROUPS, "episode_ids": EPISODES})
    adv, returns = registry("advantage").get("rloo")(batch)
    torch.testing.assert_close(adv, _per_row([0.75, 0.75, 0.75, -0.75, -0.75, 0.0, 0.0]))
    torch.testing.assert_close(returns, adv)
    # Its batch's valid flags reach the kernel too: E2 as env_error leaves the baseline.
    batch.tensors["valid"] = torch.tensor([True, True, True, False, False, True, True])
    adv, _ = registry("advantage").get("rloo")(batch)
    torch.testing.assert_close(adv, _per_row([0.5, 0.5, 0.5, 0.0, 0.0, -0.5, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "gigpo"])
def test_the_registered_estimators_read_episode_ids_from_the_batch(name):
    batch = Batch(tensors={"token_level_rewards": REWARDS, "response_mask": MASK, "step_ids": STEP_IDS},
                  non_tensors={"group_ids": GROUPS, "episode_ids": EPISODES, "step_rewards": _rows(STEP_REWARDS),
                               "anchor_obs": _rows(ANCHORS)})
    adv, _ = registry("advantage").get(name)(batch, epsilon=EPS, gamma=1.0, step_weight=1.0)
    assert float(adv[0, 0]) == pytest.approx(1.0 if name == "grpo" else 2.0, rel=1e-5)
    assert float(adv[1, 0]) == pytest.approx(1.0 if name == "grpo" else 1.0 + 0.5 / math.sqrt(0.5), rel=1e-5)
