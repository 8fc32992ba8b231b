"""``openmanus-rl eval``: a checkpoint (or a Hugging Face folder) on the env's validation tasks, in this process."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import check
from openmanus_rl_core.run.metrics import mean, success_interval
from openmanus_rl_core.run.setup import quiet_transformers, seed_all


def evaluate(cfg: Any, overrides: Sequence[str] = ()) -> int:
    """``openmanus-rl eval``: :func:`score`, printed (and written to ``trainer.eval_output`` when set)."""
    score(cfg, overrides)
    return 0


def score(cfg: Any, overrides: Sequence[str] = (), rewards: Sequence[Any] = ()) -> dict:
    """``openmanus-rl eval trainer.checkpoint=<checkpoint or run dir>``: run the env's validation tasks.
    ``rewards``: reward components given as Python callables; a run trained with some must be given them again
    (:mod:`~openmanus_rl_core.rewards.callables`).

    From a checkpoint, the env, template, reward, allocator and model are the run's own except where
    ``overrides`` (the command line) name them (:mod:`.from_run`). The policy (the checkpoint's weights on the run's
    model folder, or ``model.path``) goes into one in-process rollout engine; every validation task runs greedily
    (``trainer.val_greedy``), and the success rate and the mean reward are printed (also written as JSON to
    ``trainer.eval_output`` when set).
    """
    import torch

    from openmanus_rl_core.commands.from_run import adopt_run_config, load_policy
    from openmanus_rl_core.rewards.callables import take_again
    from openmanus_rl_core.data.tasks import load_tasks, require_tasks
    from openmanus_rl_core.plugin.envs import open_env_service
    from openmanus_rl_core.plugin.mix import source_rewards
    from openmanus_rl_core.plugin.registry import build, registry
    from openmanus_rl_core.rewards.composer import RewardComposer
    from openmanus_rl_core.rollout import AgentLoop, expand_tasks
    from openmanus_rl_core.data.generation import ensure_task_files

    quiet_transformers()
    c, ckpt = adopt_run_config(check(cfg, training=False), overrides, run_validation=True)
    if ckpt is not None:
        take_again(ckpt.python_rewards, rewards, c.reward.missing_callables, f"eval of {ckpt.path}",
                   "score it from Python with omrl.evaluate([...], rewards={...}) giving them")
    seed_all(c.seed)
    # An engine with needs_model=False (a served model) gets the run's tokenizer only, never weights.
    needs_model = getattr(registry("engine").get(c.rollout.engine), "needs_model", True)
    policy = load_policy(c, ckpt, tokenizer_only=not needs_model)
    if policy is None:
        raise ConfigError("eval needs trainer.checkpoint=<checkpoint folder or run directory> or "
                          "model.path=<Hugging Face folder>" + ("" if needs_model else " (for the tokenizer)"))
    model, tokenizer, weights = policy
    device = "cuda" if torch.cuda.is_available() and c.trainer.device != "cpu" else "cpu"
    runtime = {"model": model, "tokenizer": tokenizer} if needs_model else {"tokenizer": tokenizer}
    engine = build("engine", {"name": c.rollout.engine, "kwargs": c.rollout.engine_kwargs}, device=device,
                   seed=c.seed, **runtime)
    if weights is not None and needs_model:
        engine.update_weights(weights)
    with tempfile.TemporaryDirectory(prefix="omrl-eval-") as scratch:  # generated tasks never touch the run's files
        val_files = c.data.val_files or ensure_task_files(c, scratch)[1]
        tasks = require_tasks(load_tasks(val_files), val_files, "eval runs the validation tasks; give a file with "
                              "tasks (data.val_files, or env.val_tasks > 0)")
    if c.trainer.val_max_tasks:  # a mix's sources each get their share, as the run's validation gave them
        from openmanus_rl_core.data.sources import first_tasks
        from openmanus_rl_core.plugin.mix import is_mix, ratios

        mix = is_mix(registry("env").get(c.env.name))
        tasks = first_tasks(tasks, c.trainer.val_max_tasks, ratios(c.env.kwargs["sources"]) if mix else None)
    template = build("template", c.template)
    rcfg = dataclasses.replace(c.rollout, n=1, greedy=c.trainer.val_greedy, temperature=c.trainer.val_temperature)
    service = open_env_service(c.env.name, registry("env").get(c.env.name), c.env.kwargs, at_once=len(tasks))
    c.env.kwargs = service.kwargs
    loop = AgentLoop(engine, tokenizer, template, lambda: build("env", c.env), rcfg, memory=build("memory", c.memory))
    t0 = time.perf_counter()
    try:
        episodes = loop.run(expand_tasks([dict(t, group_id=f"eval:{i}") for i, t in enumerate(tasks)], 1))
    finally:
        service.close()
    configured = RewardComposer.from_config(c.reward.components, template=template, by_source=source_rewards(c))
    composer = RewardComposer([*configured.specs, *rewards])
    breakdowns, rmetrics = composer.compose_batch([e.trajectory for e in episodes])
    result = {
        "tasks": len(episodes),
        "success_rate": mean([bool(e.trajectory.success) for e in episodes]),
        **dict(zip(("success_ci_low", "success_ci_high"), success_interval([e.trajectory.success for e in episodes]))),
        "reward_mean": mean([b.total for b in breakdowns]),
        "num_turns": mean([e.trajectory.num_turns for e in episodes]),
        "seconds": time.perf_counter() - t0,
        **{k: v for k, v in rmetrics.items() if k.endswith("/mean")},
    }
    policy_values = _policy_metrics(c, engine, tokenizer, template)
    result.update(policy_values)
    where = (ckpt.val_source if ckpt is not None and ckpt.val_source else
             str(c.data.val_files) if c.data.val_files else f"generated (env.val_tasks={c.env.val_tasks}, seed={c.seed})")
    print(f"eval on {result['tasks']} {c.env.name} validation tasks from {where}: success rate "
          f"{result['success_rate']:.3f} (95% interval {result['success_ci_low']:.3f}-{result['success_ci_high']:.3f}), "
          f"mean reward {result['reward_mean']:.3f} ({result['seconds']:.1f}s)")
    if policy_values:
        print("policy: " + ", ".join(f"{k} {v:.4f}" for k, v in policy_values.items()))
    if c.trainer.eval_output:
        Path(c.trainer.eval_output).parent.mkdir(parents=True, exist_ok=True)
        Path(c.trainer.eval_output).write_text(json.dumps(result, indent=2))
    return result


def _policy_metrics(c: Any, engine: Any, tokenizer: Any, template: Any) -> dict[str, float]:
    """What the ``openmanus_rl_policy_metrics`` hooks measure of the policy, scored by the engine's model here."""
    from openmanus_rl_core.models.scoring import PolicyScorer, continuation_logprobs
    from openmanus_rl_core.plugin.manager import make_plugin_manager

    pm = make_plugin_manager()
    if not pm.hook.openmanus_rl_policy_metrics.get_hookimpls():
        return {}

    def score(prompts: list, continuations: list) -> list[float]:
        model = getattr(engine, "model", None)
        if not hasattr(model, "parameters"):  # vLLM or a served model: no module here to run
            raise LookupError(f"the rollout engine {c.rollout.engine!r} holds no model here to score replies with")
        return continuation_logprobs(model, prompts, continuations, tokenizer.pad_token_id)

    out: dict[str, float] = {}
    for result in pm.hook.openmanus_rl_policy_metrics(cfg=c, policy=PolicyScorer(tokenizer, template, score)):
        out.update({k: float(v) for k, v in (result or {}).items()})
    return out
