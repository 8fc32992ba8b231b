"""KL divergence between the policy and the reference policy: per-token estimators, coefficient controllers, and
the KL-in-reward penalty.

Per-token estimators of ``KL(pi || pi_ref)`` from sampled-token log-probabilities (Schulman, "Approximating KL
divergence", 2020), with ``d = logprob - ref_logprob``:

- ``k1``:  ``d``                                    (unbiased, high variance, can be negative)
- ``k2``:  ``0.5 * d^2``                            (biased, low variance, >= 0)
- ``k3``:  ``exp(-d) - (-d) - 1``, clamped to [-10, 10]   (unbiased, low variance, >= 0; verl's ``low_var_kl``)
- ``abs``: ``|d|``

verl's names ``kl`` (= k1), ``mse`` (= k2) and ``low_var_kl`` (= k3) are accepted as aliases.

As a loss term (``algorithm.use_kl_loss``) what counts is the gradient through the sampled tokens' log-probs, and
that differs from the estimate's value. In expectation over the sampled token: k2's is the gradient of
``KL(pi || pi_ref)``; k3's is that of ``KL(pi_ref || pi)`` (on the logits, ``pi - pi_ref``: every probability is
pulled toward the reference's linearly, so an action the reference gives mass to is held above zero however bad it
is); k1's is zero. docs/selfplay.md measures k3 against k2 in self-play.

That pull arrives only through sampled tokens: an action the policy has nearly dropped is seldom sampled, and when
it is, k3's value is past its clamp and its gradient 0. Where a constraint decoded the reply, the tokens it allowed
are known, and :func:`choice_kl` computes ``KL(pi_ref || pi)`` over them exactly (``algorithm.choice_kl_coeff``):
its gradient on an allowed token's logit is ``pi - pi_ref`` at every choice, sampled or not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .losses import _as_bool_mask, masked_mean

__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "choice_kl",
    "kl_penalty",
    "uses_reference",
]


def uses_reference(algo) -> bool:
    """Whether a run with the algorithm section ``algo`` needs reference log-probs: a KL term (reward penalty,
    loss, or the KL over a constraint's choices), or a teacher (``algorithm.teacher.path``: on-policy
    distillation, whose reference is the teacher)."""
    return bool(algo.use_kl_in_reward or algo.use_kl_loss or algo.choice_kl_coeff or algo.teacher.path)


def choice_kl(logp_choices: torch.Tensor, ref_logp_choices: torch.Tensor, choice_ids: torch.Tensor) -> torch.Tensor:
    """``KL(pi_ref || pi)`` over the tokens a constraint allowed, exactly, per response position ``[B, R]``.

    ``logp_choices`` and ``ref_logp_choices`` ``[B, R, K]``: the policy's and the reference's log-probabilities of
    the allowed tokens, each renormalised over them, laid out as ``choice_ids`` (ids, -1 padding; all -1 where the
    reply was free). 0 where the reply was free or a token was forced. The gradient on an allowed token's logit is
    ``pi - pi_ref``.
    """
    allowed = choice_ids >= 0
    terms = ref_logp_choices.exp() * (ref_logp_choices - logp_choices)
    return terms.masked_fill(~allowed, 0.0).sum(-1)


def _k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


def _k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


def _k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    # The inner clamp only keeps exp() finite; any value it changes lands beyond the outer clamp anyway.
    # expm1 keeps precision when the log-ratio is tiny (exp(x) - 1 would cancel to 0 or below).
    log_ratio = torch.clamp(ref_logprob - logprob, -20.0, 20.0)
    return torch.clamp(torch.expm1(log_ratio) - log_ratio, -10.0, 10.0)


def _abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "abs": _abs,
    "kl": _k1,
    "mse": _k2,
    "low_var_kl": _k3,
}


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (see the module docstring). Shapes: ``[B, T], [B, T] -> [B, T]``."""
    try:
        fn = KL_ESTIMATORS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {sorted(KL_ESTIMATORS)}") from None
    if logprob.shape != ref_logprob.shape:
        raise ValueError(f"logprob shape {tuple(logprob.shape)} != ref_logprob shape {tuple(ref_logprob.shape)}")
    return fn(logprob, ref_logprob)


@torch.no_grad()
def apply_kl_penalty(
    token_rewards: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, float]:
    """KL as a reward penalty: ``r'_t = r_t - kl_coef * kl_t * mask_t``.

    ``mean_kl`` is the batch mean of each sequence's masked token-mean KL (verl's convention), a Python float to feed
    ``AdaptiveKLController.update``. Shapes: all ``[B, T]``; returns ``([B, T], float)``.
    """
    mask = _as_bool_mask(response_mask, token_rewards, "response_mask")
    kl = kl_penalty(logprob, ref_logprob, kind)
    kl = torch.where(mask, kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    new_rewards = token_rewards - kl_coef * kl.to(token_rewards.dtype)
    per_seq = masked_mean(kl, mask, dim=-1)
    mean_kl = float(per_seq.mean()) if per_seq.numel() else 0.0
    return new_rewards, mean_kl


class FixedKLController:
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        return None


class AdaptiveKLController:
    """The adaptive KL coefficient of Ziegler et al. 2019 ("Fine-Tuning LMs from Human Preferences", sec. 2.2).

    ``update(current_kl, n_steps)``: ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``, then
    ``value *= 1 + e * n_steps / horizon``: the coefficient rises while KL exceeds the target and falls below it.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef!r}")
        if not target_kl > 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl!r}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def make_kl_controller(type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1,
                       horizon: int = 10000) -> FixedKLController | AdaptiveKLController:
    """The KL coefficient controller of ``algorithm.kl_ctrl``: ``fixed`` (beta = kl_coef) or ``adaptive``
    (PPO's proportional controller starting at kl_coef, steering the measured KL toward ``target_kl``)."""
    builders = {
        "fixed": lambda: FixedKLController(float(kl_coef)),
        "adaptive": lambda: AdaptiveKLController(float(kl_coef), float(target_kl), int(horizon)),
    }
    try:
        return builders[str(type)]()
    except KeyError:
        raise ValueError(f"unknown algorithm.kl_ctrl.type {type!r}; use one of {', '.join(builders)}") from None
