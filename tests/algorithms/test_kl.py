"""KL estimators, controllers and the KL reward penalty: hand-computed cases."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from openmanus_rl_core.algorithms import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty

T = torch.tensor
LOGP = T([[-1.0, -2.0]])
REF = T([[-1.5, -1.0]])  # logp - ref = [0.5, -1.0]


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual).float(), T(expected, dtype=torch.float32), atol=atol, rtol=1e-5)


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("k1", [[0.5, -1.0]]),
        ("k2", [[0.125, 0.5]]),
        # ref - logp = [-0.5, 1]: exp(-0.5) + 0.5 - 1 = 0.1065307, exp(1) - 1 - 1 = 0.7182818
        ("k3", [[0.1065307, 0.7182818]]),
        ("abs", [[0.5, 1.0]]),
        ("low_var_kl", [[0.1065307, 0.7182818]]),
    ],
)
def test_kl_estimators(kind, expected):
    close(kl_penalty(LOGP, REF, kind), expected)


def test_k3_is_clamped_to_ten():
    # ref - logp = 15: exp(15) - 16 is far above 10; -15: exp(-15) + 14 = 14.0000003 -> 10
    close(kl_penalty(T([[0.0, 0.0]]), T([[15.0, -15.0]]), "k3"), [[10.0, 10.0]])


def test_unknown_kl_kind_lists_valid_kinds():
    with pytest.raises(ValueError, match=r"valid kinds: .*'k3'"):
        kl_penalty(LOGP, REF, "k4")


@settings(max_examples=40, deadline=None)
@given(st.floats(-8, 8, allow_nan=False), st.floats(-8, 8, allow_nan=False))
def test_k2_k3_abs_are_non_negative_and_zero_at_equality(a, b):
    for kind in ("k2", "k3", "abs"):
        assert float(kl_penalty(T([a]), T([b]), kind)) >= -1e-7  # float32 rounding at tiny differences
        assert float(kl_penalty(T([a]), T([a]), kind)) == 0.0


def test_apply_kl_penalty_subtracts_coef_times_kl_on_masked_tokens():
    # k1 = [[0.5, -1.0, 3.0], [1.0, 2.0, 0.0]]; masks drop [0,2] and [1,2].
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = T([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
    ref = T([[-1.5, -1.0, -3.0], [-1.0, -2.0, 0.0]])
    mask = T([[1, 1, 0], [1, 1, 0]])
    new, mean_kl = apply_kl_penalty(rewards, logp, ref, mask, kl_coef=0.1, kind="k1")
    close(new, [[-0.05, 0.1, 1.0], [-0.1, 1.8, 0.0]])
    # per-sequence token means: (0.5 - 1) / 2 = -0.25 and (1 + 2) / 2 = 1.5 -> batch mean 0.625
    assert mean_kl == pytest.approx(0.625)


def test_adaptive_kl_controller_is_proportional_and_clipped():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)  # error 0.5 clipped to 0.2: 0.1 * (1 + 0.2 * 256 / 10000)
    assert ctl.value == pytest.approx(0.100512)
    ctl.update(current_kl=5.4, n_steps=1000)  # error -0.1: * (1 - 0.01)
    assert ctl.value == pytest.approx(0.09950688)
    ctl.update(current_kl=6.0, n_steps=1000)  # on target: unchanged
    assert ctl.value == pytest.approx(0.09950688)


def test_fixed_kl_controller_never_changes():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 1000)
    assert ctl.value == 0.05


def test_adaptive_kl_controller_rejects_bad_target():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 100)


def test_kl_controller_is_chosen_by_config_type():
    from openmanus_rl_core.algorithms import AdaptiveKLController, FixedKLController, make_kl_controller

    fixed = make_kl_controller(type="fixed", kl_coef=0.05)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = make_kl_controller(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=100)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(ValueError, match="unknown algorithm.kl_ctrl.type 'adaptiv'; use one of fixed, adaptive"):
        make_kl_controller(type="adaptiv")
