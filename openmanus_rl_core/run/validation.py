"""Validation during training: every validation task played greedily (or at ``trainer.val_temperature``) by the
actor ranks, scored by the run's reward, with its samples written to ``<run>/validation/`` for reading later."""

from __future__ import annotations

import time
from typing import Any

from openmanus_rl_core.run.metrics import mean, success_interval
from openmanus_rl_core.run.agents import record_agents
from openmanus_rl_core.process.alive import Alive
from openmanus_rl_core.protocols import TERMINATIONS


def validate(trainer: Any, step: int, prefix: str = "val") -> dict[str, float]:
    """Greedy (or low-temperature) episodes on every validation task: ``<prefix>/reward_mean``,
    ``<prefix>/success_rate`` with its 95% interval (``success_ci_low``/``_high``) and the reward breakdown. The sampling RNG is left untouched."""
    from openmanus_rl_core.rollout import expand_tasks, rollout_metrics
    from openmanus_rl_core.rollout.metrics import source_metrics

    t0 = time.perf_counter()
    tasks = [dict(t, group_id=f"val:{i}") for i, t in enumerate(trainer.val_tasks)]
    tasks = expand_tasks(tasks, 1)
    overrides = {"n": 1, "greedy": trainer.cfg.trainer.val_greedy, "temperature": trainer.cfg.trainer.val_temperature}
    what = "validation" if prefix == "val" else f"validation ({prefix})"
    with Alive(trainer.log, what, note=f"{len(tasks)} tasks"):  # the actor ranks play them: lines while waiting
        episodes = trainer._rollout(tasks, overrides, keep_rng=True)
    trajs = [e.trajectory for e in episodes]
    record_agents(trainer.run_dir, step, episodes, trainer.log, prefix)  # an agent run's outcomes (run/agents.py)
    breakdowns, rmetrics = trainer.composer.compose_batch(trajs)
    out = {
        f"{prefix}/reward_mean": mean([b.total for b in breakdowns]),
        f"{prefix}/success_rate": mean([bool(t.success) for t in trajs]),
        **dict(zip((f"{prefix}/success_ci_low", f"{prefix}/success_ci_high"),
                   success_interval([t.success for t in trajs]))),
        f"{prefix}/num_turns": mean([t.num_turns for t in trajs]),
        f"{prefix}/response_length": mean([sum(e.response_mask) for e in episodes]),
    }
    out.update({f"{prefix}/{k}": v for k, v in rmetrics.items() if k.endswith("/mean")})
    out.update(source_metrics(prefix, trajs, [b.total for b in breakdowns]))  # a mix of envs: each source's own
    ro = rollout_metrics(episodes)
    for name in TERMINATIONS:
        if f"rollout/termination/{name}" in ro:
            out[f"{prefix}/termination/{name}"] = ro[f"rollout/termination/{name}"]
    out.update(policy_metrics(trainer, prefix))  # plugins' measures of the policy itself (hook)
    out[f"timing/{prefix}"] = time.perf_counter() - t0
    from openmanus_rl_core.rollout.records import write_validation  # the samples, readable later

    write_validation(trainer.run_dir, step, prefix, episodes, breakdowns, trainer.tokenizer, out)
    if trainer.cfg.trainer.val_samples_to_log:
        for e in episodes[:trainer.cfg.trainer.val_samples_to_log]:
            trainer.log(f"  [{prefix} sample] task {e.trajectory.task_id}: "
                     + " | ".join(repr(t.response) for t in e.trajectory.turns))
    return out



def policy_metrics(trainer: Any, prefix: str = "val") -> dict[str, float]:
    """``<prefix>/<name>`` for every metric the ``openmanus_rl_policy_metrics`` hooks return, scored by the actor
    ranks' engine copies of the policy (the rows split evenly over the ranks)."""
    from openmanus_rl_core.distributed.sharding import split_evenly
    from openmanus_rl_core.models.scoring import PolicyScorer
    from openmanus_rl_core.plugin.registry import build

    pm = getattr(trainer, "pm", None)
    if pm is None or not pm.hook.openmanus_rl_policy_metrics.get_hookimpls():
        return {}

    def score(prompts: list, continuations: list) -> list[float]:
        shards = split_evenly(list(zip(prompts, continuations)), trainer.actor.size)
        parts = trainer.actor.call_each("score_continuations",
                                        [([p for p, _ in s], [c for _, c in s]) for s in shards])
        if any(part is None for part in parts):
            raise LookupError(f"the rollout engine {trainer.cfg.rollout.engine!r} holds no model in the actor "
                              f"process to score replies with")
        return [x for part in parts for x in part]

    scorer = PolicyScorer(trainer.tokenizer, build("template", trainer.cfg.template), score)
    out: dict[str, float] = {}
    for result in pm.hook.openmanus_rl_policy_metrics(cfg=trainer.cfg, policy=scorer):
        out.update({f"{prefix}/{k}": float(v) for k, v in (result or {}).items()})
    return out
