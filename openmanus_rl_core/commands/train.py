"""``openmanus-rl train``: the fit loop of :class:`~openmanus_rl_core.run.trainer.Trainer`, with a summary at the end."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from openmanus_rl_core.checkpoint.store import list_checkpoints, step_of
from openmanus_rl_core.config.resume import record_changes
from openmanus_rl_core.process.stopping import Abandoned
from openmanus_rl_core.run.trainer import Trainer


def train(cfg: Any, changes: Mapping[str, tuple[Any, Any]] | None = None) -> int:
    """``openmanus-rl train``: run the fit loop; prints the run directory first and a summary at the end.
    ``changes``: the keys a resume changes (:mod:`openmanus_rl_core.config.resume`), recorded in the run's config
    history with the step they take effect in."""
    return run(cfg, changes)[0]


def _not_the_auth_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def quiet_ray_auth_notice() -> None:
    """Ray turns token authentication on for a local cluster (kept: it guards the cluster's ports) and says so on
    every run; that one notice is dropped. Its other messages, the warning that authentication is off included,
    stay."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if _not_the_auth_notice not in logger.filters:
        logger.addFilter(_not_the_auth_notice)


def run(cfg: Any, changes: Mapping[str, tuple[Any, Any]] | None = None,
        rewards: Sequence[Any] = ()) -> tuple[int, dict, Trainer]:
    """``(exit status, final metrics, trainer)`` of a training run; ``rewards``: reward components given as Python
    callables (:class:`~openmanus_rl_core.rewards.composer.ComponentSpec`), next to the configured ones."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.plugin.registry import registry

    if getattr(registry("engine").get(cfg.rollout.engine), "trainable", True) is False:
        raise ConfigError(f"rollout.engine={cfg.rollout.engine}: this engine cannot be trained (its model is served "
                          f"elsewhere: no weights to update, no log-probs); use it with `openmanus-rl rollout` or "
                          f"`eval`, and train with rollout.engine=hf or vllm")
    quiet_ray_auth_notice()
    trainer = Trainer(cfg, rewards=rewards)
    trainer.stop.install()  # from the start: a stop while the model is built or the warm-up runs is a stop too
    try:
        trainer.setup()
        if trainer.stop.requested:  # the interrupt was swallowed (raised inside an import that ignores it)
            raise KeyboardInterrupt("a stop signal during the set-up")
        if changes:  # a resume's changes take effect in the step after its checkpoint (from the start without one)
            record_changes(trainer.run_dir, 0 if trainer.resume_path is None else step_of(trainer.resume_path) + 1,
                           changes)
        final = trainer.fit()
    except (KeyboardInterrupt, Abandoned):
        if not trainer.stop.requested:
            raise
        final = {}  # a signal before the first step: nothing to save
    finally:
        trainer.shutdown()
        trainer.stop.restore()
        trainer.stop.disarm()  # ended within the grace period: no forced exit later (an in-process caller goes on)
    elapsed = time.perf_counter() - trainer.t_start
    if trainer.stop.requested:  # SIGTERM / Ctrl-C: the steps done are in the newest checkpoint
        print(stopped_line(trainer, elapsed), flush=True)
        return trainer.stop.exit_code, {}, trainer
    val_r, val_s = final.get("val/reward_mean"), final.get("val/success_rate")
    summary = f"done: {trainer.total_steps} steps in {elapsed:.0f}s"
    if val_r is not None:
        summary += f"; final val reward {val_r:.3f}, success rate {val_s:.3f}"
    print(summary, flush=True)
    print(f"run directory: {trainer.run_dir}", flush=True)
    return 0, final, trainer


def resumable_dir(trainer: Trainer) -> Path | None:
    """The stopped run's folder, once it records the run's settings (config.json, which a resume composes); None
    before that: nothing of the run to continue."""
    run_dir = getattr(trainer, "run_dir", None)
    return run_dir if run_dir is not None and (run_dir / "config.json").exists() else None


def stopped_line(trainer: Trainer, elapsed: float) -> str:
    """The one line a stopped run ends with: the signal, what is kept, and the command that continues it."""
    name = signal.Signals(trainer.stop.requested).name
    run_dir = resumable_dir(trainer)
    if run_dir is None:
        return f"stopped by {name} after {elapsed:.0f}s, before the run started; nothing to continue"
    ckpts = list_checkpoints(run_dir)
    kept = f"steps up to {ckpts[-1][0]} are in {ckpts[-1][1]}" if ckpts else "no step completed"
    return (f"stopped by {name} after {elapsed:.0f}s; {kept}; continue with: openmanus-rl train "
            f"trainer.run_dir={run_dir} trainer.resume=auto")
