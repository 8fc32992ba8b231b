"""A training run's state on disk: what a checkpoint of the trainer holds, and how a run resumes from one (the
file format itself is :mod:`openmanus_rl_core.checkpoint.store`'s), and how a run goes back to its newest checkpoint
after a worker failure."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from openmanus_rl_core.rewards.callables import RECORD_KEY, record


def save(trainer: Any, step: int) -> Path:
    """A checkpoint of ``trainer`` after ``step``: workers' weights, optimizers and RNGs, the sampler, the stream's
    groups in flight, the advantage estimator's state (if it keeps one), what the hook plugins keep
    (:func:`plugin_states`), and the run's config; returns its folder."""
    from openmanus_rl_core.checkpoint.rng import capture_rng_state
    from openmanus_rl_core.checkpoint.store import save_checkpoint

    t0 = time.perf_counter()
    actor_states = trainer.actor.call("get_state")
    state: dict[str, Any] = {
        "model": actor_states[0]["model"],
        "optimizer": actor_states[0]["optimizer"],
        "scheduler": actor_states[0]["scheduler"],
        "rng": {"driver": capture_rng_state(), "actor": [s["rng"] for s in actor_states]},
        "sampler": trainer.sampler.state_dict(),
        "trainer": {"step": int(step), "skipped_steps": int(trainer.skipped_steps),
                    "kl_coef": float(trainer.kl_ctrl.value), "total_steps": int(trainer.total_steps),
                    "warmup_done": True, "policy_version": int(trainer.policy_version)},
        "meta": {"model_dir": str(trainer.model_dir), "step": int(step), "config": dataclasses.asdict(trainer.cfg),
                 "lora": trainer.cfg.model.lora.enabled, RECORD_KEY: record(trainer.python_rewards),
                 "rollouts": trainer.dumps.manifest(step) if trainer.dumps is not None else None},
    }
    if actor_states[0].get("ref_model") is not None:  # a KL term's reference policy (ActorWorker.get_state)
        state["ref_model"] = actor_states[0]["ref_model"]
    if trainer.stream is not None:
        state["stream"] = trainer.stream.state_dict()
    if hasattr(trainer.estimator, "state_dict"):  # an estimator that learns over the run (a value table)
        state["estimator"] = trainer.estimator.state_dict()
    plugins = plugin_states(trainer, step)
    if plugins:
        state["plugins"] = plugins
    if trainer.critic is not None:
        critic_states = trainer.critic.call("get_state")
        state["critic"] = {"model": critic_states[0]["model"], "optimizer": critic_states[0]["optimizer"],
                           "scheduler": critic_states[0]["scheduler"]}
        state["rng"]["critic"] = [s["rng"] for s in critic_states]
    path = save_checkpoint(trainer.run_dir, step, state, keep_last=trainer.cfg.trainer.max_checkpoints)
    trainer.log(f"checkpoint: {path} ({time.perf_counter() - t0:.1f}s)")
    return path


def plugin_states(trainer: Any, step: int) -> dict[str, Any]:
    """What the hook plugins keep in the checkpoint of ``step`` (``openmanus_rl_checkpoint_save``), merged:
    ``{key: value}``; a key two plugins return is an error naming it."""
    from openmanus_rl_core.checkpoint.store import CheckpointError

    merged: dict[str, Any] = {}
    for entries in trainer.pm.hook.openmanus_rl_checkpoint_save(cfg=trainer.cfg, run_dir=str(trainer.run_dir),
                                                                step=int(step)):
        for key, value in (entries or {}).items():
            if key in merged:
                raise CheckpointError(f"openmanus_rl_checkpoint_save: two plugins keep an entry {key!r} in the "
                                      f"checkpoint of step {int(step)}; each plugin needs a key of its own (e.g. "
                                      f"its distribution's name)")
            merged[key] = value
    return merged


def restore(trainer: Any, path: Path, state: dict | None = None) -> int:
    """Load the checkpoint's state (``state``, when already read from ``path``) into the workers, the driver and
    the hook plugins (``openmanus_rl_checkpoint_restore``); returns its step."""
    from openmanus_rl_core.checkpoint.rng import restore_rng_state
    from openmanus_rl_core.checkpoint.store import load_checkpoint

    state = load_checkpoint(path) if state is None else state
    load_workers(trainer.actor, trainer.critic, path, state)
    trainer.sampler.load_state_dict(state["sampler"])
    t = state["trainer"]
    trainer.skipped_steps = int(t.get("skipped_steps", 0))
    trainer.kl_ctrl.value = float(t.get("kl_coef", trainer.kl_ctrl.value))
    restore_rng_state(state["rng"]["driver"])
    trainer.policy_version = int(t.get("policy_version", t["step"]))
    trainer._stream_state = state.get("stream")
    if "estimator" in state:
        trainer.estimator.load_state_dict(state["estimator"])
    trainer.pm.hook.openmanus_rl_checkpoint_restore(cfg=trainer.cfg, run_dir=str(trainer.run_dir), step=int(t["step"]),
                                                    state=dict(state.get("plugins") or {}))
    # Every rollout tags its tokens with the engine's policy version (the stream's staleness, the rollout dumps).
    trainer.actor.call("sync_rollout_weights", version=trainer.policy_version)
    return int(t["step"])


def restart_workers(trainer: Any, err: Exception, restarts: int) -> int:
    """After a worker failure: new worker groups, state from the newest complete checkpoint; returns its step.

    At most ``trainer.max_worker_restarts`` times per run; without a checkpoint to go back to, the error stands.
    """
    from openmanus_rl_core.checkpoint.store import CheckpointError, load_latest_checkpoint
    from openmanus_rl_core.run.metrics import MetricsLogger
    from openmanus_rl_core.run.setup import start_workers

    allowed = trainer.cfg.trainer.max_worker_restarts
    found, why = None, f"trainer.max_worker_restarts={allowed} used up"
    if restarts <= allowed:
        try:
            found = load_latest_checkpoint(trainer.run_dir)
            why = f"no complete checkpoint in {trainer.run_dir} to restart from (set trainer.save_freq)"
        except CheckpointError as exc:
            why = str(exc)
    if found is None:
        trainer.log(f"worker failure, not restarting: {why}")
        raise err
    path, state = found
    trainer.log(f"{err}\nrestarting the workers ({restarts}/{allowed}) from {path}")
    for g in (trainer.actor, trainer.critic):
        if g is not None:
            g.kill()
    trainer.actor = trainer.critic = None
    trainer.stream = None  # its ranks are gone; the checkpoint's groups are played again
    start_workers(trainer)
    step = restore(trainer, path, state)
    # The lines logged after that checkpoint are dropped: those steps run again.
    trainer.metrics_logger.close()
    trainer.metrics_logger = MetricsLogger(trainer.run_dir, tensorboard="tensorboard" in trainer.cfg.trainer.loggers,
                                           resume_step=step)
    return step


def load_workers(actor: Any, critic: Any, path: Path, state: dict) -> None:
    """The checkpoint's weights, optimizer and scheduler states and RNGs into the actor (and critic) ranks; the
    checkpoint must come from as many ranks."""
    import ray

    model_ref = ray.put(state["model"])
    optim_ref = ray.put(state["optimizer"])
    rngs = state["rng"]["actor"]
    if len(rngs) != actor.size:
        raise RuntimeError(f"{path} was saved by {len(rngs)} actor workers but this run has {actor.size}; "
                           f"resume with trainer.num_workers={len(rngs)}")
    ref = ray.put(state["ref_model"]) if "ref_model" in state else None
    actor.call_each("load_state", [(model_ref, optim_ref, state["scheduler"], rngs[r], ref) for r in range(actor.size)])
    if critic is not None:
        if "critic" not in state:
            raise RuntimeError(f"{path} holds no critic state; it was saved by a run without a critic")
        c = state["critic"]
        cm, co = ray.put(c["model"]), ray.put(c["optimizer"])
        crngs = state["rng"]["critic"]
        critic.call_each("load_state", [(cm, co, c["scheduler"], crngs[r]) for r in range(critic.size)])
