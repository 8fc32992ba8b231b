"""The registered advantage estimators (entry-point group ``openmanus_rl.advantages``).

Each is called as ``estimator(batch, **cfg) -> (advantages, returns)``: it reads the tensors it needs from the
``Batch``, passes the batch's optional ``valid`` (``[B]`` bool, written by ``rollout.build_batch``) and
``episode_ids`` (turn samples) on, and calls its pure kernel in :mod:`.advantages`. ``cfg`` is the algorithm's
estimator kwargs; a key an estimator does not use is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..batch import Batch
from .advantages import compute_gae, compute_grpo, compute_rae, compute_reinforce_plus_plus, compute_rloo
from .steps import compute_gigpo, compute_state_baseline

__all__ = [
    "gae_estimator",
    "gigpo_estimator",
    "grpo_estimator",
    "grpo_no_std_estimator",
    "opd_estimator",
    "rae_estimator",
    "reinforce_plus_plus_estimator",
    "rloo_estimator",
    "self_imitation_estimator",
    "state_baseline_estimator",
]


def _cfg(cfg: dict, key: str, default: Any) -> Any:
    """``cfg[key]``, or ``default`` when the key is absent or None (a config's ``null`` means "use the default")."""
    value = cfg.get(key)
    return default if value is None else value


def _need(batch: Batch, keys: Sequence[str], name: str) -> None:
    if not isinstance(batch, Batch):
        raise TypeError(f"advantage estimator {name!r} takes a Batch, got {type(batch).__name__}")
    batch.require(*keys, who=f"advantage estimator {name!r}")


def gae_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``gae``. Batch: tensors ``token_level_rewards``, ``response_mask``, ``values`` (critic).

    cfg: ``gamma`` (1.0), ``lam`` (1.0); other keys are ignored. Returns ``(advantages, returns)``.
    """
    _need(batch, ("token_level_rewards", "response_mask", "values"), "gae")
    return compute_gae(
        batch["token_level_rewards"], batch["values"], batch["response_mask"],
        gamma=float(_cfg(cfg, "gamma", 1.0)), lam=float(_cfg(cfg, "lam", 1.0)), valid=batch.get("valid"),
    )


def _grpo(batch: Batch, name: str, norm_by_std: bool, cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    _need(batch, ("token_level_rewards", "response_mask", "group_ids"), name)
    adv = compute_grpo(
        batch["token_level_rewards"], batch["response_mask"], batch["group_ids"],
        epsilon=float(_cfg(cfg, "epsilon", 1e-6)), norm_by_std=norm_by_std, valid=batch.get("valid"),
        episode_ids=batch.get("episode_ids"),
    )
    return adv, adv


def grpo_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``grpo``. Batch: tensors ``token_level_rewards``, ``response_mask``; non_tensors ``group_ids``.

    cfg: ``epsilon`` (1e-6), ``norm_by_std`` (True); other keys are ignored. Returns ``(advantages, advantages)``.
    """
    return _grpo(batch, "grpo", bool(_cfg(cfg, "norm_by_std", True)), cfg)


def grpo_no_std_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``grpo_no_std`` (Dr. GRPO: no std division). Same batch keys as ``grpo``; cfg: ``epsilon``."""
    return _grpo(batch, "grpo_no_std", False, cfg)


def rae_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``rae`` (role-conditioned advantages). Batch: tensors ``token_level_rewards``, ``response_mask``;
    non_tensors ``roles`` (the trajectory's ``info["role"]``: a game and a seat).

    No cfg keys are used. Returns ``(advantages, advantages)``, ``[B, T]``."""
    _need(batch, ("token_level_rewards", "response_mask", "roles"), "rae")
    adv = compute_rae(batch["token_level_rewards"], batch["response_mask"], batch["roles"], valid=batch.get("valid"),
                      episode_ids=batch.get("episode_ids"))
    return adv, adv


def state_baseline_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``state_baseline`` (each turn against the other turns of the batch at the same state). Batch:
    tensors ``response_mask``, ``step_ids``; non_tensors ``anchor_obs``, ``step_rewards``, ``roles``.

    cfg: ``gamma`` (1.0); other keys are ignored. Returns ``(advantages, advantages)``, ``[B, T]``."""
    _need(batch, ("response_mask", "step_ids", "anchor_obs", "step_rewards", "roles"), "state_baseline")
    adv = compute_state_baseline(
        batch["response_mask"], batch["step_ids"], batch["step_rewards"], batch["anchor_obs"], batch["roles"],
        gamma=float(_cfg(cfg, "gamma", 1.0)), valid=batch.get("valid"), episode_ids=batch.get("episode_ids"))
    return adv, adv


state_baseline_estimator.reads_turn_rewards = True  # its returns are the turns' rewards (config rule)


def rloo_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``rloo``. Batch: tensors ``token_level_rewards``, ``response_mask``; non_tensors ``group_ids``.

    No cfg keys are used. Returns ``(advantages, advantages)``.
    """
    _need(batch, ("token_level_rewards", "response_mask", "group_ids"), "rloo")
    adv = compute_rloo(batch["token_level_rewards"], batch["response_mask"], batch["group_ids"],
                       valid=batch.get("valid"), episode_ids=batch.get("episode_ids"))
    return adv, adv


def reinforce_plus_plus_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``reinforce_plus_plus``. Batch: tensors ``token_level_rewards``, ``response_mask``.

    cfg: ``gamma`` (1.0); other keys are ignored. Returns ``(advantages, advantages)``.
    """
    _need(batch, ("token_level_rewards", "response_mask"), "reinforce_plus_plus")
    adv = compute_reinforce_plus_plus(
        batch["token_level_rewards"], batch["response_mask"], gamma=float(_cfg(cfg, "gamma", 1.0)),
        valid=batch.get("valid"),
    )
    return adv, adv


def gigpo_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``gigpo``. Batch: tensors ``token_level_rewards``, ``response_mask``, ``step_ids`` ([B, T] long,
    -1 off-turn); non_tensors ``group_ids``, ``anchor_obs`` (per sample: list of str, one per step) and
    ``step_rewards`` (per sample: list of float, one per step; a [B, S] tensor is accepted too).

    cfg: ``gamma`` (0.95), ``step_weight`` (1.0), ``epsilon`` (1e-6), ``norm_by_std`` (True); other keys are
    ignored. Returns ``(advantages, advantages)``.
    """
    _need(
        batch,
        ("token_level_rewards", "response_mask", "step_ids", "group_ids", "anchor_obs", "step_rewards"),
        "gigpo",
    )
    adv = compute_gigpo(
        batch["token_level_rewards"], batch["response_mask"], batch["group_ids"], batch["step_ids"],
        batch["step_rewards"], batch["anchor_obs"],
        gamma=float(_cfg(cfg, "gamma", 0.95)), step_weight=float(_cfg(cfg, "step_weight", 1.0)),
        epsilon=float(_cfg(cfg, "epsilon", 1e-6)), norm_by_std=bool(_cfg(cfg, "norm_by_std", True)),
        valid=batch.get("valid"), episode_ids=batch.get("episode_ids"),
    )
    return adv, adv


def self_imitation_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``self_imitation`` (rejection-sampling fine-tuning, RAFT / ReST / DigiRL's filtered BC on the
    policy's own samples). Batch: tensors ``response_mask``; non_tensors ``success`` (per sample).

    ``A_t = 1`` on every response token of a successful sample, 0 elsewhere: with the on-policy ratio of 1, the
    policy loss's gradient is then supervised learning on the successful samples alone. No cfg keys are used.
    Returns ``(advantages, advantages)``, ``[B, T]``."""
    _need(batch, ("response_mask", "success"), "self_imitation")
    mask = batch["response_mask"]
    won = torch.as_tensor([bool(s) for s in batch["success"]], dtype=mask.dtype, device=mask.device)
    adv = (mask * won[:, None]).float()
    valid = batch.get("valid")
    if valid is not None:
        adv = adv * torch.as_tensor(valid, dtype=adv.dtype, device=adv.device)[:, None]
    return adv, adv


def opd_estimator(batch: Batch, **cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry point ``opd`` (on-policy distillation: Agarwal et al. 2024, GKD; Thinking Machines 2025). Batch: tensors
    ``old_log_probs`` (the policy's, on its own samples), ``ref_log_probs`` (the teacher's: ``algorithm.teacher.path``
    makes it the reference policy), ``response_mask``.

    ``A_t = log pi_teacher(y_t | y_<t) - log pi(y_t | y_<t)``: minus the per-token reverse KL (the k1 estimate of
    ``KL(pi || pi_teacher)`` at the sampled token), with no discount, baseline or whitening; the env's rewards are
    not used. 0 off the response. No cfg keys are used. Returns ``(advantages, advantages)``, ``[B, T]``."""
    _need(batch, ("old_log_probs", "ref_log_probs", "response_mask"), "opd")
    mask = batch["response_mask"].bool()
    adv = torch.where(mask, batch["ref_log_probs"] - batch["old_log_probs"], torch.zeros((), dtype=torch.float32))
    valid = batch.get("valid")
    if valid is not None:
        adv = adv * torch.as_tensor(valid, dtype=adv.dtype, device=adv.device)[:, None]
    return adv.float(), adv.float()
