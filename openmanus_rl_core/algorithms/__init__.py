"""RL algorithm kernels: advantage estimators, policy/value losses, KL penalties.

Pure tensor functions in the style of verl's ``core_algos``: tensors in, tensors out, each documented with its
formula and shapes (``advantages``, those per turn in ``steps``, ``losses``, ``kl``; helpers in ``grouping``,
``discounting``). The registered entry points adapt them to a ``Batch``: the advantage estimators in ``estimators``,
``ppo_clip_loss`` in ``losses``.
"""

from .advantages import (
    compute_gae,
    compute_grpo,
    compute_rae,
    compute_reinforce_plus_plus,
    compute_rloo,
    discounted_returns,
    episode_index,
    group_index,
    grpo_sequence_advantages,
    rloo_sequence_advantages,
)
from .estimators import (
    gae_estimator,
    gigpo_estimator,
    grpo_estimator,
    grpo_no_std_estimator,
    rae_estimator,
    reinforce_plus_plus_estimator,
    rloo_estimator,
    state_baseline_estimator,
)
from .kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
    uses_reference,
)
from .losses import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss,
    ppo_clip_loss,
    value_loss,
)
from .steps import compute_gigpo, compute_state_baseline, gigpo_step_advantages

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "make_kl_controller",
    "agg_loss",
    "apply_kl_penalty",
    "compute_gae",
    "compute_gigpo",
    "compute_grpo",
    "compute_rae",
    "compute_state_baseline",
    "compute_reinforce_plus_plus",
    "compute_rloo",
    "discounted_returns",
    "episode_index",
    "entropy_from_logits",
    "gae_estimator",
    "gigpo_estimator",
    "gigpo_step_advantages",
    "group_index",
    "grpo_estimator",
    "grpo_no_std_estimator",
    "grpo_sequence_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "ppo_clip_loss",
    "rae_estimator",
    "reinforce_plus_plus_estimator",
    "rloo_estimator",
    "rloo_sequence_advantages",
    "state_baseline_estimator",
    "uses_reference",
    "value_loss",
]
