"""Losses, aggregation and masked statistics: hand-computed cases written as literals."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from openmanus_rl_core.algorithms import (
    agg_loss,
    entropy_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    ppo_clip_loss,
    value_loss,
)

T = torch.tensor
NAN = float("nan")


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual).float(), T(expected, dtype=torch.float32), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------------- masked statistics
def test_masked_mean_ignores_masked_values_even_nan():
    close(masked_mean(T([1.0, NAN, 3.0]), T([1, 0, 1])), 2.0)
    close(masked_mean(T([[1.0, 2.0], [5.0, NAN]]), T([[1, 1], [1, 0]]), dim=-1), [1.5, 5.0])


def test_masked_mean_of_empty_mask_is_zero():
    close(masked_mean(T([1.0, 2.0]), T([0, 0])), 0.0)


def test_masked_var_is_unbiased():
    # [1, 2, 3, 4]: mean 2.5, squared deviations sum 5, / (4 - 1)
    close(masked_var(T([1.0, 2.0, 99.0, 3.0, 4.0]), T([1, 1, 0, 1, 1])), 5.0 / 3.0)


def test_masked_whiten_zero_mean_unit_std_and_zero_outside_mask():
    # [1, 3]: mean 2, unbiased std sqrt(2) -> [-1/sqrt2, 1/sqrt2]
    close(masked_whiten(T([1.0, 50.0, 3.0]), T([1, 0, 1])), [-0.707107, 0.0, 0.707107])


def test_entropy_from_logits():
    probs = T([[0.5, 0.25, 0.25], [0.25, 0.25, 0.25]])  # second row: 3 of 4 equal logits -> uniform over 3
    logits = torch.log(probs)
    # H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.0397208; uniform over 3: ln 3 = 1.0986123
    close(entropy_from_logits(logits), [1.0397208, 1.0986123])


# ------------------------------------------------------------------------------------------------ aggregation
LOSS = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, NAN]])
MASK = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the third row has no response token at all


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token-mean", {}, 7.0 / 3.0),  # (1 + 2 + 4) / 3
        ("seq-mean-token-sum", {}, 3.5),  # (3 + 4) / 2
        ("seq-mean-token-mean", {}, 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", {}, 7.0 / 6.0),  # (3/3 + 4/3) / 2
        ("seq-mean-token-sum-norm", {"norm_constant": 2.0}, 1.75),  # (3/2 + 4/2) / 2
    ],
)
def test_agg_loss_modes(mode, kwargs, expected):
    close(agg_loss(LOSS, MASK, mode, **kwargs), expected)


def test_agg_loss_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(LOSS, MASK, "token-sum")


# ------------------------------------------------------------------------------------------------ policy loss
# ratio 1.5 / A=+1: max(-1.5, -1.2) = -1.2 (clipped);  ratio 0.5 / A=+1: max(-0.5, -0.8) = -0.5
# ratio 1.5 / A=-1: max(1.5, 1.2) = 1.5;                ratio 0.5 / A=-1: max(0.5, 0.8) = 0.8 (clipped)
# ratio 5.0 / A=-1: max(5, 1.2) = 5, dual-clip with c=3 caps it at 3.
RATIOS = T([[1.5, 0.5, 1.5, 0.5, 5.0]])
ADV = T([[1.0, 1.0, -1.0, -1.0, -1.0]])
OLD = torch.zeros(1, 5)
ALL = torch.ones(1, 5)


def test_policy_loss_clips_ratio_and_reports_clipfrac():
    loss, metrics = policy_loss(OLD, torch.log(RATIOS), ADV, ALL, clip_low=0.2, clip_high=0.2)
    close(loss, (-1.2 - 0.5 + 1.5 + 0.8 + 5.0) / 5)  # 1.12
    assert metrics["clipfrac"] == pytest.approx(0.4)
    assert metrics["clipfrac_lower"] == 0.0
    # approx_kl = mean(old - new) = -(2 ln 1.5 + 2 ln 0.5 + ln 5) / 5
    assert metrics["approx_kl"] == pytest.approx(-0.2068147535, abs=1e-6)
    assert all(isinstance(v, float) for v in metrics.values())


def test_policy_loss_dual_clip_caps_negative_advantage_loss():
    loss, metrics = policy_loss(OLD, torch.log(RATIOS), ADV, ALL, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    close(loss, (-1.2 - 0.5 + 1.5 + 0.8 + 3.0) / 5)  # 0.72
    assert metrics["clipfrac_lower"] == pytest.approx(0.2)


def test_policy_loss_separate_high_clip():
    # clip_high 0.28: ratio 1.5 / A=+1 -> -1.28; clip_low 0.1: ratio 0.5 / A=-1 -> 0.9
    loss, _ = policy_loss(OLD[:, :4], torch.log(RATIOS[:, :4]), ADV[:, :4], ALL[:, :4], clip_low=0.1, clip_high=0.28)
    close(loss, (-1.28 - 0.5 + 1.5 + 0.9) / 4)


@pytest.mark.parametrize("ratio, adv, expected", [
    (1.5, 1.0, -1.28),  # above 1 + clip_high: clipped to 1.28
    (1.2, 1.0, -1.2),  # inside [1 - clip_low, 1 + clip_high]: unclipped
    (0.5, -1.0, 0.9),  # below 1 - clip_low: clipped to 0.9
    (0.8, -1.0, 0.9),
    (0.95, -1.0, 0.95),  # inside: unclipped
    (0.5, 1.0, -0.5),  # a lower ratio with A > 0 is never clipped up
])
def test_policy_loss_clips_each_token_at_its_own_bound(ratio, adv, expected):
    # One token at a time: a mean over several tokens can hide swapped bounds (their errors cancel).
    loss, _ = policy_loss(torch.zeros(1, 1), torch.log(T([[ratio]])), T([[adv]]), torch.ones(1, 1),
                          clip_low=0.1, clip_high=0.28)
    close(loss, expected)


def test_policy_loss_gradient_flows_only_through_unclipped_tokens():
    logprob = torch.log(RATIOS).requires_grad_(True)
    loss, _ = policy_loss(OLD, logprob, ADV, ALL, clip_c=3.0)
    loss.backward()
    # d/dlogp of -A*r is -A*r / 5 for unclipped tokens (0.5 and 1.5 ratios in tokens 1, 2); clipped/capped: 0
    close(logprob.grad, [[0.0, -0.1, 0.3, 0.0, 0.0]])


def test_policy_loss_ignores_masked_tokens_and_clamps_log_ratio():
    logprob = T([[0.0, 100.0]])  # log-ratio 100 would overflow exp; it sits on a masked token
    loss, metrics = policy_loss(torch.zeros(1, 2), logprob, T([[2.0, -1.0]]), T([[1.0, 0.0]]))
    close(loss, -2.0)
    assert metrics["clipfrac"] == 0.0
    big, _ = policy_loss(torch.zeros(1, 1), T([[100.0]]), T([[-1.0]]), T([[1.0]]))
    close(big, math.exp(20.0), atol=1.0)  # clamped to exp(20), finite


@pytest.mark.parametrize("clip_c", [1.0, 0.5, 0.0])
def test_policy_loss_rejects_dual_clip_not_above_one(clip_c):
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(OLD, OLD, ADV, ALL, clip_c=clip_c)


def test_policy_loss_seq_mean_token_sum_mode():
    loss, _ = policy_loss(OLD, torch.log(RATIOS), ADV, T([[1, 1, 0, 0, 0]]), agg_mode="seq-mean-token-sum")
    close(loss, -1.7)


def test_ppo_clip_loss_reads_cfg_and_ignores_unknown_keys():
    loss, metrics = ppo_clip_loss(OLD, torch.log(RATIOS), ADV, ALL, clip_c=3.0, clip_high=0.28, unknown=1)
    close(loss, (-1.28 - 0.5 + 1.5 + 0.8 + 3.0) / 5)
    default, _ = ppo_clip_loss(OLD, torch.log(RATIOS), ADV, ALL)
    close(default, 1.12)
    nulls, _ = ppo_clip_loss(OLD, torch.log(RATIOS), ADV, ALL, clip_low=None, clip_c=None, agg_mode=None)
    close(nulls, 1.12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=1, max_size=12),
       st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=12, max_size=12))
def test_policy_loss_equals_minus_mean_advantage_when_policy_unchanged(adv, logp):
    n = len(adv)
    a, lp = T([adv]), T([logp[:n]])
    loss, metrics = policy_loss(lp, lp.clone(), a, torch.ones(1, n))
    close(loss, -sum(adv) / n, atol=1e-4)
    assert metrics["clipfrac"] == 0.0 and metrics["approx_kl"] == 0.0


# ------------------------------------------------------------------------------------------------- value loss
def test_value_loss_clipped():
    # token 0: (1-2)^2 = 1 vs clipped v = 0.5 + 0.2 = 0.7 -> (0.7-2)^2 = 1.69 (clipped term larger)
    # token 1: (2-1)^2 = 1 both ways.  loss = 0.5 * (1.69 + 1) / 2 = 0.6725; masked token 2 ignored.
    values, old_values, returns = T([[1.0, 2.0, 9.0]]), T([[0.5, 2.0, 0.0]]), T([[2.0, 1.0, 0.0]])
    loss, metrics = value_loss(values, old_values, returns, T([[1, 1, 0]]), clip=0.2)
    close(loss, 0.6725)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)


def test_value_loss_without_clip():
    loss, metrics = value_loss(T([[1.0, 2.0]]), T([[0.5, 2.0]]), T([[2.0, 1.0]]), T([[1, 1]]), clip=None)
    close(loss, 0.5)
    assert metrics["vf_clipfrac"] == 0.0
