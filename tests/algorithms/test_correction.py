"""The rollout correction (openmanus_rl_core/algorithms/correction.py): which mode a run applies, and the TIS weight
as a constant of the loss."""

import math

import pytest
import torch

from openmanus_rl_core.algorithms import policy_loss
from openmanus_rl_core.algorithms.correction import correction_mode, truncated_is_weights
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.config.schema import AlgorithmConfig, RolloutConfig

LOG = math.log
PROX = [[LOG(0.5), LOG(0.2), LOG(0.9), 0.0]]
BEHAV = [[LOG(0.25), LOG(0.4), LOG(0.3), 0.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


# ------------------------------------------------------------------------------------------------- the mode
@pytest.mark.parametrize("max_staleness, mode", [(None, "off"), (0, "behaviour"), (1, "behaviour"), (2, "behaviour")])
def test_auto_is_behaviour_in_the_stream_at_every_staleness_bound_zero_included(max_staleness, mode):
    """``auto``: the stream (any max_staleness, 0 too: vLLM's numerics differ from the trainer's even on-policy)
    takes the ratio against the engine's log-probs; a lockstep run (null) applies none."""
    assert correction_mode(AlgorithmConfig(), RolloutConfig(max_staleness=max_staleness)) == mode


def test_the_composed_config_at_max_staleness_0_corrects_with_behaviour():
    cfg = load(["rollout.max_staleness=0"], training=False)
    assert cfg.algorithm.rollout_correction == "auto"
    assert correction_mode(cfg.algorithm, cfg.rollout) == "behaviour"
    named = load(["rollout.max_staleness=0", "algorithm.rollout_correction=tis"], training=False)
    assert correction_mode(named.algorithm, named.rollout) == "tis"  # a named mode is taken as given


# --------------------------------------------------------------------------------------------- the weight
def test_the_tis_weight_carries_no_gradient_even_from_log_probs_that_require_it():
    """w = min(pi_prox / pi_behav, cap) is a constant of the loss: built from log-probs that require grad, it has
    no graph, and a loss weighted by it sends gradient to pi_theta only."""
    prox = torch.tensor(PROX, requires_grad=True)
    behav = torch.tensor(BEHAV, requires_grad=True)
    w, _ = truncated_is_weights(prox, behav, MASK, cap=2.0)
    assert not w.requires_grad and w.grad_fn is None
    assert w.tolist()[0] == pytest.approx([2.0, 0.5, 2.0, 0.0])

    logp = torch.tensor([[LOG(0.6), LOG(0.2), LOG(1.35), 0.0]], requires_grad=True)  # r = 1.2, 1.0, 1.5
    adv = torch.tensor([[1.0, -1.0, 1.0, 0.0]])
    loss, _ = policy_loss(prox.detach(), logp, adv * w, MASK, clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert prox.grad is None and behav.grad is None
    # -w A r / 3 on the unclipped tokens, 0 where the clip acts (token 3) and off the mask
    assert logp.grad.tolist()[0] == pytest.approx([-2 * 1.2 / 3, 0.5 * 1.0 / 3, 0.0, 0.0], abs=1e-6)
