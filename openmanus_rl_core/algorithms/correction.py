"""Rollout correction: training on tokens that another policy sampled (docs/async.md).

Three policies meet in one update:

- the **behaviour** policy ``π_behav`` sampled the tokens: the engine's per-token log-probs (``rollout_log_probs``).
  In the group stream it may be up to η versions old, and with vLLM it differs from the trainer's numerics even at
  η=0;
- the **proximal** policy ``π_prox``: the trainer's weights at the start of the update (the recomputed
  ``old_log_probs``);
- ``π_θ``, the policy being updated.

The decoupled PPO objective clips on ``π_θ / π_prox`` and weights each token by ``π_prox / π_behav``. Truncated
importance sampling (TIS) caps that weight at ``c``:

    w_t = min(exp(log π_prox(t) - log π_behav(t)), c)          (no gradient)
    L_t = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - ε_low, 1 + ε_high)),   r_t = π_θ(t) / π_prox(t)

Because ``w_t >= 0`` it can be folded into the advantage: ``w * max(-A r, -A clip(r)) = max(-(wA) r, -(wA) clip(r))``
(the dual-clip cap ``-A c`` scales the same way), so the registered PPO losses compute the decoupled objective from
``advantages * w`` and ``old_log_probs = log π_prox`` unchanged. A loss that is not linear in the advantage would
need the weight itself.

The actor's update applies it (``workers/actor.py``).

With one update per step (one mini-batch, one epoch: the default), ``r_t`` is 1 and the clip never acts: the
objective is a policy gradient weighted by ``w``, with no trust region around the policy that sampled. Measured on
key_door behind the latency env (bench/async.py --learning, seed 0, lr 5e-4), that diverged at η=1 and η=2
(validation success 0.77 -> 0.00 in 20 steps). ``behaviour`` takes the PPO ratio against the engine's log-probs
instead, ``r_t = π_θ / π_behav``: tokens whose probability already moved past the clip since they were sampled get
no gradient, which kept the same runs at lockstep's success. It is the group stream's default. When the update is on-policy within the step (one mini-batch,
one epoch), ``π_prox`` is the current policy: its log-probs are the update's own forward pass, detached, so the
correction costs no extra forward pass.
"""

from __future__ import annotations

from typing import Any

import torch

from openmanus_rl_core.algorithms.losses import masked_mean


def correction_mode(algo: Any, rcfg: Any, agent: Any = None) -> str:
    """The correction a run applies (``algo``: the algorithm section, ``rcfg``: the rollout section, ``agent``: the
    agent section): ``tis``, ``behaviour`` or ``off``. ``auto`` is ``tis`` for an agent behind the gateway whose
    decoding may be constrained (``agent.constrained``: a grammar mask makes the engine sample from the masked,
    renormalised policy, so ``pi_old / pi_engine`` is the allowed tokens' mass, at most 1: the exact importance
    weight of the unmasked policy), ``behaviour`` in the group stream, else ``off``."""
    if algo.rollout_correction != "auto":
        return algo.rollout_correction
    if agent is not None and (agent.command or agent.function) and agent.constrained:
        return "tis"
    return "behaviour" if rcfg.max_staleness is not None else "off"


def truncated_is_weights(prox_logprob: torch.Tensor, behav_logprob: torch.Tensor, response_mask: torch.Tensor,
                         cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """``w = min(exp(prox - behav), cap)`` per token (0 off the mask) and its metrics.

    Shapes: all ``[B, T]``. Metrics: ``actor/behav_prox_kl`` (``mean_mask(behav - prox)``, the k1 estimate of
    KL(π_behav || π_prox) on the sampled tokens), ``actor/tis_weight_mean`` (before the cap) and
    ``actor/tis_capped_frac`` (share of tokens where the cap bit).
    """
    if not cap >= 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap!r}")
    if prox_logprob.shape != behav_logprob.shape or prox_logprob.shape != response_mask.shape:
        raise ValueError(f"shapes differ: proximal {tuple(prox_logprob.shape)}, behaviour "
                         f"{tuple(behav_logprob.shape)}, mask {tuple(response_mask.shape)}")
    mask = response_mask.bool()
    log_ratio = torch.where(mask, prox_logprob - behav_logprob, torch.zeros_like(prox_logprob))
    raw = torch.exp(log_ratio.clamp(max=20.0))
    w = torch.where(mask, raw.clamp(max=float(cap)), torch.zeros_like(raw))
    metrics = {
        "actor/behav_prox_kl": float(masked_mean(-log_ratio, mask)),
        "actor/tis_weight_mean": float(masked_mean(raw, mask)),
        "actor/tis_capped_frac": float(masked_mean((raw > cap).to(raw.dtype), mask)),
    }
    return w.detach(), metrics
