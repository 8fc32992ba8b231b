"""The cross-field rules of a training run's config (:data:`RULES`), checked by
:func:`openmanus_rl_core.config.loading.load` after the schema's types and ranges: each rule returns one line naming the
key and value that break it, or None."""

from __future__ import annotations

from openmanus_rl_core.config.schema import Config

# Estimators that standardise or baseline within a group of samples of one task.
GROUP_ESTIMATORS = ("grpo", "grpo_no_std", "rloo", "gigpo")
# Estimators that read the critic's values.
VALUE_ESTIMATORS = ("gae",)


def _rule_group_size(c: Config) -> str | None:
    if c.algorithm.adv_estimator in GROUP_ESTIMATORS and c.rollout.n < 2:
        return (f"rollout.n={c.rollout.n}: algorithm.adv_estimator={c.algorithm.adv_estimator} compares samples "
                f"within a group and needs rollout.n >= 2")
    return None


def _rule_critic(c: Config) -> str | None:
    if c.algorithm.adv_estimator in VALUE_ESTIMATORS and not c.algorithm.use_critic:
        return (f"algorithm.use_critic={c.algorithm.use_critic}: algorithm.adv_estimator="
                f"{c.algorithm.adv_estimator} reads values and needs algorithm.use_critic=true")
    return None


def _rule_turn_rewards(c: Config) -> str | None:
    if not c.algorithm.use_kl_in_reward:
        return None
    from openmanus_rl_core.plugin.registry import registry

    estimators, name = registry("advantage"), c.algorithm.adv_estimator
    if name not in estimators.names() or not getattr(estimators.get(name), "reads_turn_rewards", False):
        return None  # an unknown estimator is named where it is built
    return (f"algorithm.use_kl_in_reward=true: algorithm.adv_estimator={name} reads each turn's reward, which the KL "
            "penalty on the tokens' rewards does not reach; use algorithm.use_kl_loss=true instead")


def _rule_reply_budget(c: Config) -> str | None:
    if c.rollout.max_new_tokens > c.rollout.max_response_tokens:
        return (f"rollout.max_new_tokens={c.rollout.max_new_tokens}: one reply cannot exceed "
                f"rollout.max_response_tokens={c.rollout.max_response_tokens}")
    return None


def _rule_sample_budget(c: Config) -> str | None:
    if c.rollout.max_new_tokens >= c.rollout.max_sample_tokens:
        return (f"rollout.max_sample_tokens={c.rollout.max_sample_tokens}: a turn sample needs room for its context "
                f"besides rollout.max_new_tokens={c.rollout.max_new_tokens}; raise it above that")
    return None


def _rule_correction(c: Config) -> str | None:
    if c.algorithm.rollout_correction == "tis" and c.algorithm.recompute_old_log_probs in ("false", "rollout"):
        return (f"algorithm.recompute_old_log_probs={c.algorithm.recompute_old_log_probs}: "
                f"algorithm.rollout_correction=tis weighs the engine's log-probs against recomputed ones; "
                f"use recompute_old_log_probs=auto or true")
    return None


def _rule_replicate_precision(c: Config) -> str | None:
    for role, sec in (("actor", c.actor), ("critic", c.critic)):
        if sec.sharding == "replicate" and c.trainer.mixed_precision:
            return (f"{role}.sharding=replicate: trainer.mixed_precision={c.trainer.mixed_precision} needs an FSDP2 "
                    f"sharding; use {role}.sharding=full, grad_op or auto")
    return None


def _rule_overlap_update(c: Config) -> str | None:
    """The overlapped update computes each group's gradient alone, before the batch is complete."""
    if not c.rollout.overlap_update:
        return None
    a, actor = c.algorithm, c.actor
    conflicts = (  # (the setting is in the way, why)
        (c.rollout.max_staleness != 0,
         f"rollout.max_staleness={c.rollout.max_staleness} (it needs the stream at 0: one version per batch)"),
        (a.adv_estimator not in GROUP_ESTIMATORS,
         f"algorithm.adv_estimator={a.adv_estimator} (it needs a group baseline: {', '.join(GROUP_ESTIMATORS)})"),
        (a.use_critic or c.critic.warmup_steps > 0,
         f"algorithm.use_critic={a.use_critic}, critic.warmup_steps={c.critic.warmup_steps}"),
        (a.use_kl_in_reward or a.use_kl_loss,
         f"algorithm.use_kl_in_reward={a.use_kl_in_reward}, use_kl_loss={a.use_kl_loss} (no reference pass)"),
        (actor.ppo_epochs != 1 or actor.ppo_mini_batch_size is not None,
         f"actor.ppo_epochs={actor.ppo_epochs}, ppo_mini_batch_size={actor.ppo_mini_batch_size} "
         f"(one optimizer step per batch)"),
        (a.recompute_old_log_probs == "true",
         f"algorithm.recompute_old_log_probs={a.recompute_old_log_probs} (no separate old-log-prob pass)"),
    )
    why = next((w for bad, w in conflicts if bad), None)
    return None if why is None else f"rollout.overlap_update=true does not work with {why}"


def _rule_model_folders(c: Config) -> str | None:
    from pathlib import Path

    teacher = c.algorithm.teacher.path
    if c.algorithm.adv_estimator == "opd" and not teacher:
        return ("algorithm.teacher.path=None: algorithm.adv_estimator=opd learns from a teacher's log-probs; set it to "
                "a model folder with the policy's tokenizer (openmanus-rl export writes one)")
    if c.warmup.demonstrator == "model" and not c.warmup.model_path:
        return ("warmup.model_path=None: warmup.demonstrator=model plays the demonstrations with a model; set it to "
                "a model folder (openmanus-rl export writes one)")
    for key, folder in (("algorithm.teacher.path", teacher), ("warmup.model_path", c.warmup.model_path)):
        if folder and not (Path(folder) / "config.json").is_file():
            return f"{key}={folder}: not a model folder (no config.json there)"
    return None


def _rule_ref_reset(c: Config) -> str | None:
    a = c.algorithm
    if a.ref_reset_steps is not None and not (a.use_kl_loss or a.use_kl_in_reward or a.choice_kl_coeff):
        return (f"algorithm.ref_reset_steps={a.ref_reset_steps}: it moves the KL term's reference, and no KL term is "
                f"on; set algorithm.use_kl_loss=true, use_kl_in_reward=true or choice_kl_coeff, or leave "
                f"ref_reset_steps unset")
    return None


def _rule_choice_kl(c: Config) -> str | None:
    if c.algorithm.choice_kl_coeff and not c.rollout.constrain_actions:
        return (f"algorithm.choice_kl_coeff={c.algorithm.choice_kl_coeff}: it acts where a constraint chose the "
                f"reply's tokens, and rollout.constrain_actions is off; turn it on or leave the coefficient at 0")
    return None


def _rule_all_action(c: Config) -> str | None:
    a = c.algorithm
    if not a.all_action_coeff:
        return None
    if not c.rollout.constrain_actions:
        return (f"algorithm.all_action_coeff={a.all_action_coeff}: it moves the tokens a constraint allowed, and "
                f"rollout.constrain_actions is off; turn it on or leave the coefficient at 0")
    from openmanus_rl_core.plugin.registry import registry

    estimators = registry("advantage")
    if a.adv_estimator in estimators.names() and not getattr(estimators.get(a.adv_estimator), "values_choices", False):
        return (f"algorithm.all_action_coeff={a.all_action_coeff}: it reads each allowed token's value, and "
                f"algorithm.adv_estimator={a.adv_estimator} gives none; use value_table or leave the coefficient at 0")
    return None


def _rule_agent(c: Config) -> str | None:
    g = c.agent
    if g.command and g.function:
        return f"agent.command={g.command!r} and agent.function={g.function!r}: set one of them"
    return None


def _rule_constrained_engine(c: Config) -> str | None:
    if not c.rollout.constrain_actions:
        return None
    from openmanus_rl_core.plugin.registry import registry

    engines = registry("engine")
    if c.rollout.engine not in engines.names() or getattr(engines.get(c.rollout.engine), "decodes_constraints", True):
        return None  # an unknown engine is named where the engine is built
    return (f"rollout.constrain_actions=true: rollout.engine={c.rollout.engine} sends its model no grammar; use an "
            f"engine that decodes under one (hf, vllm), or rollout.constrain_actions=false")


# Cross-field rules of a training run: each returns one line naming the key and value, or None.
RULES = (_rule_group_size, _rule_critic, _rule_turn_rewards, _rule_reply_budget, _rule_sample_budget, _rule_correction,
         _rule_replicate_precision, _rule_overlap_update, _rule_model_folders, _rule_ref_reset,
         _rule_choice_kl, _rule_all_action, _rule_agent, _rule_constrained_engine)
