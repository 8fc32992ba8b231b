"""Advantage estimators: hand-computed cases (expected values worked out by hand, written as literals) and
property tests."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from openmanus_rl_core.algorithms import (
    compute_gae,
    compute_gigpo,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
    discounted_returns,
    gae_estimator,
    gigpo_estimator,
    gigpo_step_advantages,
    group_index,
    grpo_estimator,
    grpo_no_std_estimator,
    grpo_sequence_advantages,
    reinforce_plus_plus_estimator,
    rloo_estimator,
    rloo_sequence_advantages,
)
from openmanus_rl_core.batch import Batch, MissingKeyError

T = torch.tensor
PROPS = settings(max_examples=40, deadline=None)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual.float(), T(expected, dtype=torch.float32), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------------------------ GRPO
# Group "a" scores 1, 0, 2 (mean 1, unbiased std 1); group "b" is a single sample.
# Row 0 has a reward of 5 on a mask-0 (observation) token that must be ignored.
GRPO_REWARDS = T([[0.0, 5.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [3.0, 0.0, 0.0]])
GRPO_MASK = T([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])


def test_grpo_normalises_scores_within_group_and_skips_masked_rewards():
    adv = compute_grpo(GRPO_REWARDS, GRPO_MASK, ["a", "a", "a", "b"], epsilon=0.0)
    close(adv, [[0.0, 0.0, 0.0], [-1.0, -1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


def test_grpo_epsilon_is_added_to_std():
    adv = compute_grpo(GRPO_REWARDS, GRPO_MASK, ["a", "a", "a", "b"], epsilon=1.0)
    close(adv, [[0.0, 0.0, 0.0], [-0.5, -0.5, 0.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])


def test_dr_grpo_does_not_divide_by_std():
    rewards = T([[2.0], [0.0], [4.0], [7.0]])
    adv = compute_grpo(rewards, torch.ones(4, 1), [0, 0, 0, 1], norm_by_std=False)
    close(adv, [[0.0], [-2.0], [2.0], [0.0]])


@pytest.mark.parametrize(
    "labels",
    [
        ["x", "x", "x", "y"],
        [7, 7, 7, 3],
        np.array(["x", "x", "x", "y"]),
        np.array([7, 7, 7, 3]),
        np.array(["x", "x", "x", ("t", 1)], dtype=object),
        T([7, 7, 7, 3]),
        [("q", 0), ("q", 0), ("q", 0), ("q", 1)],
    ],
    ids=["str", "int", "np-str", "np-int", "np-object", "tensor", "tuple"],
)
def test_grpo_accepts_any_hashable_group_labels(labels):
    adv = compute_grpo(GRPO_REWARDS, GRPO_MASK, labels, epsilon=0.0)
    close(adv[:, 0], [0.0, -1.0, 1.0, 0.0])


def test_group_index_maps_equal_labels_to_equal_ids():
    ids, n = group_index(["b", "a", "b", "c"], 4)
    assert n == 3
    assert ids[0] == ids[2] and len({int(ids[0]), int(ids[1]), int(ids[3])}) == 3


def test_group_ids_of_wrong_length_raise():
    with pytest.raises(ValueError, match="3 labels but the batch has 4"):
        compute_grpo(GRPO_REWARDS, GRPO_MASK, ["a", "a", "b"])


def test_grpo_rejects_mismatched_shapes_naming_them():
    with pytest.raises(ValueError, match="response_mask has shape"):
        compute_grpo(GRPO_REWARDS, GRPO_MASK[:, :2], ["a"] * 4)


# ------------------------------------------------------------------------------------------------------ RLOO
def test_rloo_subtracts_mean_of_the_other_samples():
    # group scores 1, 2, 6: 1-(2+6)/2 = -3, 2-(1+6)/2 = -1.5, 6-(1+2)/2 = 4.5; the lone "z" gets 0.
    rewards = T([[1.0, 0.0], [1.0, 1.0], [0.0, 6.0], [9.0, 9.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    adv = compute_rloo(rewards, mask, ["g", "g", "g", "z"])
    close(adv, [[-3.0, -3.0], [-1.5, -1.5], [0.0, 4.5], [0.0, 0.0]])


# ------------------------------------------------------------------------------------------------------- GAE
def test_gae_multi_turn_skips_observation_tokens():
    # Tokens: agent, agent, obs, obs, agent. gamma 0.9, lam 0.8 (hand computation):
    #   t=4: delta = 1 - 0.8 = 0.2,            A4 = 0.2,                      R4 = 1.0
    #   t=1: delta = 0.9*0.8 - 0.6 = 0.12,     A1 = 0.12 + 0.72*0.2 = 0.264,  R1 = 0.864
    #   t=0: delta = 0.9*0.6 - 0.5 = 0.04,     A0 = 0.04 + 0.72*0.264 = 0.23008, R0 = 0.73008
    # whitened [0.23008, 0.264, 0.2] (mean 0.23136, unbiased std 0.0320192) -> [-0.039976, 1.019384, -0.979408]
    rewards = T([[0.0, 0.0, 7.0, 7.0, 1.0]])
    values = T([[0.5, 0.6, 9.0, 9.0, 0.8]])
    mask = T([[1, 1, 0, 0, 1]])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(ret, [[0.73008, 0.864, 0.0, 0.0, 1.0]])
    close(adv, [[-0.039976, 1.019384, 0.0, 0.0, -0.979408]], atol=1e-4)


def test_gae_lam_zero_is_one_step_td_error():
    # lam = 0: A_t = r_t + gamma V_{t+1} - V_t = [0 + 0.5*2 - 1, 3 + 0 - 2] = [0, 1]; R = A + V = [1, 3].
    adv, ret = compute_gae(T([[0.0, 3.0]]), T([[1.0, 2.0]]), T([[1.0, 1.0]]), gamma=0.5, lam=0.0)
    close(ret, [[1.0, 3.0]])


def test_gae_across_rows_whitens_jointly():
    # Row returns with V=0, gamma=lam=1: [1,1,1], [0,0,0], [3,2,1]; advantages = returns, mean 1, std 1.
    rewards = T([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = compute_gae(rewards, torch.zeros(3, 3), torch.ones(3, 3))
    close(ret, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [3.0, 2.0, 1.0]])
    close(adv, [[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0], [2.0, 1.0, 0.0]], atol=1e-4)


# ------------------------------------------------------------------------------------------------ REINFORCE++
def test_reinforce_plus_plus_discounts_over_agent_tokens_only():
    # Row 0: mask [1,0,1], gamma 0.5: G2 = 2, G0 = 1 + 0.5*2 = 2 (the obs token neither adds nor discounts).
    # Row 1: G = [0.75, 1.5, 3]. Whitened over [2, 2, 0.75, 1.5, 3].
    rewards = T([[1.0, 5.0, 2.0], [0.0, 0.0, 3.0]])
    mask = T([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    adv = compute_reinforce_plus_plus(rewards, mask, gamma=0.5)
    close(adv, [[0.182574, 0.0, 0.182574], [-1.338877, -0.426006, 1.399735]], atol=1e-4)


# ----------------------------------------------------------------------------------------------------- GiGPO
# Group "g": trajectory A (anchors s0, s1; step rewards 0, 1) and B (anchors s0, s2; rewards 0, 0).
# Trajectory C is alone in group "h" and also visits "s0" (must not join g's step group).
GIGPO_STEP_IDS = T([[0, 0, -1, 1, 1, -1], [0, -1, 1, 1, -1, -1], [0, 0, -1, -1, -1, -1]])
GIGPO_MASK = T([[1, 1, 0, 1, 1, 0], [1, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
GIGPO_REWARDS = T([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0] * 6, [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
GIGPO_ANCHORS = [["s0", "s1"], ["s0", "s2"], ["s0"]]
GIGPO_STEP_REWARDS = [[0.0, 1.0], [0.0, 0.0], [1.0]]
# gamma 0.5: returns A = [0.5, 1], B = [0, 0]. Step group (g, s0) = {0.5, 0}: mean .25, std .353553 -> +-0.707107;
# (g, s1), (g, s2), (h, s0) are singletons -> 0. Episode: scores 1, 0 -> +-0.707107; C alone -> 0.
# step_weight 0.5: A step0 tokens 0.707107 + 0.5*0.707107 = 1.06066, A step1 tokens 0.707107; B mirrored.
GIGPO_EXPECTED = [
    [1.06066, 1.06066, 0.0, 0.707107, 0.707107, 0.0],
    [-1.06066, 0.0, -0.707107, -0.707107, 0.0, 0.0],
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
]


def test_gigpo_combines_episode_and_step_group_advantages():
    adv = compute_gigpo(
        GIGPO_REWARDS, GIGPO_MASK, ["g", "g", "h"], GIGPO_STEP_IDS, GIGPO_STEP_REWARDS, GIGPO_ANCHORS,
        gamma=0.5, step_weight=0.5, epsilon=0.0,
    )
    close(adv, GIGPO_EXPECTED)


@pytest.mark.parametrize("ids", [(0, 1, 2), (10**15, 7, 3)], ids=["small-ids", "huge-ids"])
def test_gigpo_accepts_padded_tensors_for_anchors_and_step_rewards(ids):
    s0, s1, s2 = ids
    anchors = T([[s0, s1], [s0, s2], [s0, -1]])
    step_rewards = T([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    adv = compute_gigpo(
        GIGPO_REWARDS, GIGPO_MASK, ["g", "g", "h"], GIGPO_STEP_IDS, step_rewards, anchors,
        gamma=0.5, step_weight=0.5, epsilon=0.0,
    )
    close(adv, GIGPO_EXPECTED)


def test_gigpo_step_weight_zero_is_grpo():
    adv = compute_gigpo(
        GIGPO_REWARDS, GIGPO_MASK, ["g", "g", "h"], GIGPO_STEP_IDS, GIGPO_STEP_REWARDS, GIGPO_ANCHORS,
        gamma=0.5, step_weight=0.0,
    )
    torch.testing.assert_close(adv, compute_grpo(GIGPO_REWARDS, GIGPO_MASK, ["g", "g", "h"]))


def test_gigpo_groups_repeated_states_within_a_trajectory():
    # One trajectory visits "s" twice (rewards 1 then 0, gamma 1): returns 1 and 0 form one step group
    # -> +-0.707107; the other trajectory has a single "t" step (singleton -> 0). Episode scores equal -> 0.
    adv = compute_gigpo(
        T([[1.0, 0.0], [1.0, 0.0]]), torch.ones(2, 2), [0, 0], T([[0, 1], [0, 0]]),
        [[1.0, 0.0], [1.0]], [["s", "s"], ["t"]], gamma=1.0, step_weight=1.0, epsilon=0.0,
    )
    close(adv, [[0.707107, -0.707107], [0.0, 0.0]])


def test_gigpo_rejects_step_rewards_that_do_not_match_the_steps():
    with pytest.raises(ValueError, match="sample 1 has 1 step rewards but 2 anchor observations"):
        compute_gigpo(
            GIGPO_REWARDS, GIGPO_MASK, ["g", "g", "h"], GIGPO_STEP_IDS, [[0.0, 1.0], [0.0], [1.0]], GIGPO_ANCHORS
        )


def test_gigpo_rejects_step_ids_beyond_the_trajectory():
    with pytest.raises(ValueError, match="step_ids of sample 2"):
        compute_gigpo(
            GIGPO_REWARDS, GIGPO_MASK, ["g", "g", "h"], GIGPO_STEP_IDS.clone().index_fill_(1, T([1]), 1),
            GIGPO_STEP_REWARDS, GIGPO_ANCHORS,
        )


# ------------------------------------------------------------------------------------------ registered wrappers
def _batch(**extra_non_tensors):
    return Batch(
        {
            "token_level_rewards": GIGPO_REWARDS,
            "response_mask": GIGPO_MASK,
            "step_ids": GIGPO_STEP_IDS,
            "values": torch.zeros(3, 6),
        },
        {"group_ids": ["g", "g", "h"], **extra_non_tensors},
    )


def test_estimators_share_one_signature_and_ignore_unknown_cfg():
    batch = _batch(anchor_obs=GIGPO_ANCHORS, step_rewards=GIGPO_STEP_REWARDS)
    cfg = {"gamma": 0.5, "lam": 0.9, "epsilon": 0.0, "step_weight": 0.5, "some_other_key": "ignored"}
    for estimator in (gae_estimator, grpo_estimator, grpo_no_std_estimator, rloo_estimator,
                      reinforce_plus_plus_estimator, gigpo_estimator):
        adv, ret = estimator(batch, **cfg)
        assert adv.shape == ret.shape == (3, 6)
        assert bool((adv[GIGPO_MASK == 0] == 0).all())
    close(gigpo_estimator(batch, **cfg)[0], GIGPO_EXPECTED)
    close(grpo_no_std_estimator(batch)[0][:, 0], [0.5, -0.5, 0.0])


def test_estimator_cfg_null_means_default():
    batch = _batch()
    torch.testing.assert_close(gae_estimator(batch, gamma=None, lam=None)[1], gae_estimator(batch)[1])


def test_critic_free_estimators_return_advantages_as_returns():
    adv, ret = grpo_estimator(_batch())
    assert ret is adv


@pytest.mark.parametrize(
    "estimator, missing",
    [(gigpo_estimator, "anchor_obs"), (gae_estimator, "values"), (rloo_estimator, "group_ids")],
)
def test_estimator_names_the_missing_batch_key(estimator, missing):
    batch = _batch(step_rewards=GIGPO_STEP_REWARDS)
    batch = batch.select([k for k in batch.keys() if k != missing])
    with pytest.raises(MissingKeyError, match=missing) as info:
        estimator(batch)
    assert isinstance(info.value, KeyError)


# --------------------------------------------------------------------------------------------- property tests
@st.composite
def grouped_scores(draw):
    n_groups = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 5), min_size=n_groups, max_size=n_groups))
    labels = [f"task{g}" for g, size in enumerate(sizes) for _ in range(size)]
    order = draw(st.permutations(range(len(labels))))
    labels = [labels[i] for i in order]
    scores = draw(st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=len(labels), max_size=len(labels)))
    return labels, T(scores).unsqueeze(1)


@st.composite
def masked_tokens(draw):
    b, t = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    rewards = draw(st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=b * t, max_size=b * t))
    mask = draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))
    values = draw(st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=b * t, max_size=b * t))
    groups = draw(st.lists(st.integers(0, 2), min_size=b, max_size=b))
    return T(rewards).view(b, t), T(mask).view(b, t), T(values).view(b, t), groups


def _per_group(values, labels):
    out = {}
    for v, g in zip(values.tolist(), labels):
        out.setdefault(g, []).append(v)
    return out


@PROPS
@given(grouped_scores(), st.booleans())
def test_grpo_advantages_sum_to_zero_in_each_group_and_singletons_get_zero(data, norm_by_std):
    labels, scores = data
    adv = compute_grpo(scores, torch.ones_like(scores), labels, norm_by_std=norm_by_std)[:, 0]
    for group in _per_group(adv, labels).values():
        assert abs(sum(group)) < 1e-3 * max(1, len(group))
        if len(group) == 1:
            assert group[0] == 0.0


@PROPS
@given(grouped_scores())
def test_rloo_advantages_sum_to_zero_in_each_group(data):
    labels, scores = data
    adv = compute_rloo(scores, torch.ones_like(scores), labels)[:, 0]
    for group in _per_group(adv, labels).values():
        assert abs(sum(group)) < 1e-3 * max(1, len(group))
        if len(group) == 1:
            assert group[0] == 0.0


@PROPS
@given(masked_tokens())
def test_every_estimator_puts_zero_on_masked_positions(data):
    rewards, mask, values, groups = data
    off = mask == 0
    outs = [
        compute_grpo(rewards, mask, groups),
        compute_rloo(rewards, mask, groups),
        compute_reinforce_plus_plus(rewards, mask, 0.9),
        *compute_gae(rewards, values, mask, 0.9, 0.95),
    ]
    for out in outs:
        assert bool((out[off] == 0).all())
        assert bool(torch.isfinite(out).all())


@PROPS
@given(masked_tokens())
def test_gae_with_unit_gamma_and_lambda_returns_the_return_to_go(data):
    rewards, mask, values, _ = data
    _, returns = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # Reference: reverse cumulative sum of the masked-in rewards (observation tokens contribute nothing).
    masked_rewards = rewards * mask
    rtg = masked_rewards.flip(1).cumsum(1).flip(1) * mask
    torch.testing.assert_close(returns, rtg, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------ long sequences vs a plain loop
def _gae_reference(rewards, values, mask, gamma, lam):
    """The textbook backward loop, per sample and per token, skipping mask-0 tokens."""
    adv = [[0.0] * len(r) for r in rewards]
    for i, (r, v, m) in enumerate(zip(rewards, values, mask)):
        next_value, running = 0.0, 0.0
        for t in reversed(range(len(r))):
            if m[t]:
                running = r[t] + gamma * next_value - v[t] + gamma * lam * running
                adv[i][t] = running
                next_value = v[t]
    return adv


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.5, 0.97, 1.0]), st.sampled_from([0.0, 0.9, 1.0]))
def test_gae_matches_a_per_token_loop_on_sequences_longer_than_a_block(seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(3, 150, generator=g), torch.randn(3, 150, generator=g)
    mask = torch.rand(3, 150, generator=g) < 0.6
    mask[2] = False  # a row with no response tokens
    expected = T(_gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam))
    _, returns = compute_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(returns, (expected + values) * mask, atol=1e-4, rtol=1e-4)
    _, returns64 = compute_gae(rewards.double(), values.double(), mask, gamma, lam)  # the float64 path
    assert returns64.dtype == torch.float64
    torch.testing.assert_close(returns64, ((expected + values) * mask).double(), atol=1e-4, rtol=1e-4)


def test_discount_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match="lam must be in"):
        compute_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=0.9, lam=1.5)


def test_grpo_and_rloo_sequence_kernels():
    scores = T([1.0, 0.0, 2.0, 3.0])
    close(grpo_sequence_advantages(scores, ["a", "a", "a", "b"], epsilon=0.0), [0.0, -1.0, 1.0, 0.0])
    close(rloo_sequence_advantages(T([1.0, 2.0, 6.0, 3.0]), ["a", "a", "a", "b"]), [-3.0, -1.5, 4.5, 0.0])


def test_gigpo_step_advantages_kernel():
    step_adv, num_steps = gigpo_step_advantages(
        ["g", "g", "h"], GIGPO_STEP_REWARDS, GIGPO_ANCHORS, gamma=0.5, epsilon=0.0
    )
    close(step_adv, [[0.707107, 0.0], [-0.707107, 0.0], [0.0, 0.0]])
    assert num_steps.tolist() == [2, 2, 1]


def test_discounted_returns_match_a_per_token_loop_on_long_sequences():
    g = torch.Generator().manual_seed(3)
    rewards, mask = torch.randn(2, 100, generator=g), torch.rand(2, 100, generator=g) < 0.5
    expected = torch.zeros(2, 100)
    for i in range(2):
        running = 0.0
        for t in reversed(range(100)):
            if mask[i, t]:
                running = float(rewards[i, t]) + 0.9 * running
                expected[i, t] = running
    torch.testing.assert_close(discounted_returns(rewards, mask, 0.9), expected, atol=1e-5, rtol=1e-5)
