"""The trainer: the driver of one run, and its fit loop as named phases.

One training step (:meth:`Trainer.train_step`; the driver orchestrates, the heavy work runs in Ray worker groups),
each phase a method of that name::

    phase_rollout        tasks (TaskSampler) --expand n--> one shard per actor rank; every rank runs the agent loop
                         with its own engine and envs (dynamic sampling replaces groups without spread); or,
                         with rollout.max_staleness, B groups from the stream (rollout/stream.py); with
                         rollout.overlap_update, groups' gradients in the batch's tail (run/overlap.py) timing/rollout
    phase_reward         reward composer (weighted components) -> allocator -> token_level_scores  timing/reward
    phase_log_probs      old log-probs (the PPO ratio's behaviour policy) and reference log-probs  timing/old_log_prob
    phase_values         critic values (PPO with GAE)                                              timing/values
    phase_advantages     KL as a reward penalty (scores - beta * kl), then the estimator by name   timing/adv
    phase_update_critic  value regression (mini-batches x ppo_epochs, grad clip)                   timing/update_critic
    phase_update_actor   policy update (mini-batches x ppo_epochs, grad clip; the rollout correction,
                         algorithms/correction.py, when on)                                        timing/update_actor
    phase_sync_weights   new weights gathered and pushed into every rank's rollout engine         timing/sync_weights

then, in :meth:`Trainer.fit`: validation (run/validation.py), the log (metrics.jsonl, trackers, progress bar, hooks)
and the checkpoint (run/state.py). Step 0 -- the untrained validation and the supervised warm-up -- is
:func:`openmanus_rl_core.run.warmup.step_zero`; what a run is built from before all that (:meth:`Trainer.setup`) is
run/setup.py.

The embedded default (``openmanus-rl train`` with no overrides) builds a tiny Qwen2-style model and a tokenizer
trained on the env's oracle episodes, validates it untrained (step 0), runs a short supervised warm-up on oracle
demonstrations (``warmup/*`` metrics), then trains with GRPO. The commands are in :mod:`openmanus_rl_core.commands`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from openmanus_rl_core.process import heap
from openmanus_rl_core.config.loading import check
from openmanus_rl_core.run.metrics import mean
from openmanus_rl_core.rewards.failures import check_reward_failures
from openmanus_rl_core.config.schema import Config
from openmanus_rl_core.process.stopping import Abandoned, StopOnSignal
from openmanus_rl_core.run.agents import record_agents
from openmanus_rl_core.run.progress import ConsoleLog
from openmanus_rl_core.run.setup import quiet_transformers, setup
from openmanus_rl_core.run.state import restart_workers, restore, save
from openmanus_rl_core.run.validation import validate
from openmanus_rl_core.run.warmup import step_zero
from openmanus_rl_core.run.worker_inputs import actor_batch, critic_batch, lean_batch

__all__ = ["Trainer", "mean"]


# ------------------------------------------------------------------------------------------------- Trainer
class Trainer:
    """The driver of one run: builds everything from the config, then :meth:`fit`."""

    def __init__(self, cfg: Any, rewards: Sequence[Any] = ()):
        """``rewards``: reward components given as Python callables (:mod:`~openmanus_rl_core.rewards.callables`),
        next to the configured ones; the run records them by name."""
        quiet_transformers()
        self.t_start = time.perf_counter()
        self.cfg_node = cfg  # as composed (the run_start hook gets it)
        self.cfg: Config = check(cfg)
        self.python_rewards = list(rewards)
        self.log = ConsoleLog()
        self.stop = StopOnSignal(self.log, self.cfg.trainer.stop_grace_s)  # installed by fit (process/stopping.py)
        self.ray_started = False
        self.resume_path: Path | None = None
        self._resume_state: dict | None = None  # the checkpoint read by setup, until fit hands it to the workers
        self.actor = None
        self.critic = None
        self.metrics_logger = None
        self.bar = None
        self.env_service = None
        self.can_warm_up = True  # False once the warm-up found no demonstrations (no oracle, none in the data)
        self.stream = None  # the group stream (rollout.max_staleness set), from the first step on
        self._stream_state: dict | None = None  # a resumed stream's groups, to play again
        self.policy_version = 0  # actor updates so far: the version of the rollout engine's weights
        self.overlap = None  # rollout.overlap_update: the step's gradients so far (run/overlap.py)
        self.dumps = None  # trainer.save_rollouts: the run's rollout dumps (run/dumps.py), from set-up on
        self.dropped: list[dict] = []  # the step's groups played and not trained (dynamic sampling, staleness)
        if self.cfg.rollout.overlap_update:
            from openmanus_rl_core.run.overlap import OverlappedUpdate

            self.overlap = OverlappedUpdate(self)

    # ------------------------------------------------------------------------------------------- set-up
    def setup(self) -> None:
        """Everything the run is built from its config (run/setup.py)."""
        setup(self)

    def worker_classes(self) -> tuple[type, type]:
        """The actor and critic worker classes (tests return subclasses that inject faults)."""
        from openmanus_rl_core.workers import ActorWorker, CriticWorker

        return ActorWorker, CriticWorker

    # --------------------------------------------------------------------------------------- rollout
    def _rollout(self, tasks: list[dict], overrides: Mapping[str, Any] | None = None, keep_rng: bool = False):
        from openmanus_rl_core.distributed.sharding import split_evenly

        shards = split_evenly(tasks, self.actor.size)
        parts = self.actor.call_each("rollout", [(s,) for s in shards], overrides=overrides, keep_rng=keep_rng,
                                     abandon=self.stop.abandon_now)  # a stop signal gives the rollout up
        return [ep for part in parts for ep in part]

    # -------------------------------------------------------------------------------------- one step
    def train_step(self, step: int) -> dict[str, float]:
        """One step: the phases below, in order (see the module doc); returns the step's metrics."""
        from openmanus_rl_core.run.metrics import Timer, perf_metrics

        self.timer = timer = Timer()
        metrics: dict[str, float] = {}
        with timer("step"):
            episodes = self.phase_rollout(step, metrics)
            batch = self.phase_reward(step, episodes, metrics)
            self.phase_log_probs(batch, metrics)
            self.phase_values(batch)
            self.phase_advantages(batch, metrics)
            self.phase_update_critic(batch, step, metrics)
            if step > self.cfg.critic.warmup_steps:  # the actor waits while a fresh critic learns
                self.phase_update_actor(batch, step, metrics)
                self.phase_sync_weights()
            metrics["train/skipped_steps"] = float(self.skipped_steps)
            if self.dumps is not None:  # trainer.save_rollouts: what this step trained on (run/dumps.py)
                with timer("dump"):
                    self.dumps.write(step, batch, self.dropped)
            self.dropped = []
        metrics.update(perf_metrics(batch, timer.timings))
        metrics.update(timer.metrics())
        return metrics

    def phase_rollout(self, step: int, metrics: dict[str, float]) -> list:
        """The episodes to train on: this step's own batch (each task ``rollout.n`` times, one group), or with
        ``rollout.max_staleness`` set, B complete groups from the group stream."""
        with self.timer("rollout"):
            if self.cfg.rollout.max_staleness is not None:
                if self.overlap is not None:  # every step (the config rules keep a critic's warm-up out)
                    self.overlap.begin()
                episodes = self._stream().next_batch(self.policy_version, metrics,
                                                     on_groups=None if self.overlap is None else self.overlap.add)
                self.dropped, self.stream.dropped = self.stream.dropped, []
                if self.overlap is not None:
                    self.overlap.add(episodes)  # none left, unless the stream held some back
                    metrics["timing/overlap_update"] = self.overlap.seconds
                    metrics["stream/overlap_chunks"] = float(self.overlap.chunks)
            else:
                with self.stop.keeping(self.sampler):  # abandoned: its tasks are drawn again on resume
                    episodes = self._batch_rollout(step, metrics)
        trajectories = [e.trajectory for e in episodes]
        record_agents(self.run_dir, step, episodes, self.log)  # an agent run's outcomes in <run>/agents (run/agents.py)
        self.env_errors.update(step, [t.termination for t in trajectories], [t.error for t in trajectories])
        self.pm.hook.openmanus_rl_process_trajectories(trajectories=trajectories, step=step)
        return episodes

    def _batch_rollout(self, step: int, metrics: dict[str, float]) -> list:
        """B task rows played by the actor ranks; with ``algorithm.filter_groups``, as many more as dynamic sampling
        needs (:func:`~openmanus_rl_core.algorithms.dynamic_sampling.fill_batch`)."""
        from openmanus_rl_core.algorithms.dynamic_sampling import fill_batch
        from openmanus_rl_core.rollout import expand_tasks

        def play(rows: list[dict], first: int) -> list:
            # Deterministic group ids (expand_tasks would draw random ones): same run, same groups.
            return self._rollout(expand_tasks([dict(t, group_id=f"{step}:{first + i}") for i, t in enumerate(rows)],
                                              self.n))

        if self.group_filter is None:
            return play(self.sampler.next_batch(), 0)
        return fill_batch(play, self.sampler.next_batch, self.n, self.group_filter, self.max_extra_groups, metrics,
                          self.dropped)

    def _stream(self):
        """The group stream (rollout/stream.py), started at the first step that needs it."""
        from openmanus_rl_core.rollout.stream import GroupStream

        if self.stream is None:
            self.stream = GroupStream(self.actor, self.cfg.rollout, self.sampler.next_batch,
                                      self.cfg.data.train_batch_size, self.group_filter, self.max_extra_groups,
                                      abandon=self.stop.abandon_now)
            if self._stream_state is not None:
                self.stream.load_state_dict(self._stream_state)
        return self.stream

    def phase_reward(self, step: int, episodes: list, metrics: dict[str, float]):
        """Rewards composed per trajectory and placed on tokens by the allocator: the training batch, with
        ``token_level_scores``."""
        from openmanus_rl_core.rollout import build_batch, rollout_metrics
        from openmanus_rl_core.rollout.metrics import source_metrics

        trajectories = [e.trajectory for e in episodes]
        with self.timer("reward"):
            if self.overlap is not None:  # composed as the groups came in
                breakdowns = self.overlap.breakdowns(episodes)
                reward_metrics = self.composer.batch_metrics(breakdowns)
            else:
                breakdowns, reward_metrics = self.composer.compose_batch(trajectories)
            check_reward_failures(self.composer.labels, breakdowns, trajectories, step, self.cfg.reward.on_error,
                                  self.log)
            batch = build_batch(episodes, breakdowns, self.allocator, self.pad_token_id,
                                self.cfg.rollout.keep_env_errors)
        ro_metrics = rollout_metrics(episodes, elapsed_s=self.timer.timings["rollout"])
        self.pm.hook.openmanus_rl_rollout_end(trajectories=trajectories, metrics={**reward_metrics, **ro_metrics},
                                              step=step)
        totals = [b.total for b in breakdowns]
        metrics["train/reward_mean"] = mean(totals)
        metrics["train/reward_std"] = float(np.std(totals)) if totals else float("nan")
        metrics["train/success_rate"] = mean([bool(t.success) for t in trajectories])
        metrics["train/num_turns"] = mean([t.num_turns for t in trajectories])
        metrics["train/response_length"] = mean([sum(e.response_mask) for e in episodes])
        metrics.update({f"train/{k}": v for k, v in reward_metrics.items()})
        metrics.update(ro_metrics)
        metrics.update(source_metrics("train", trajectories, totals))  # a mix of envs: each source's own
        return batch

    def phase_log_probs(self, batch, metrics: dict[str, float]) -> None:
        """``old_log_probs`` and ``ref_log_probs`` where the step needs them.

        Old log-probs (``algorithm.recompute_old_log_probs``): ``auto`` recomputes them when the update is off-policy
        within the step (several mini-batches or epochs) or a KL penalty needs them, else the update uses the
        detached current ones; ``true`` always, ``false`` never, ``rollout`` takes the engine's sampling log-probs (so
        does ``algorithm.rollout_correction=behaviour``, the group stream's default).
        Reference log-probs: when a KL term (reward penalty or loss) is on; with ``algorithm.choice_kl_coeff``
        also the reference's over each constraint's allowed tokens (``ref_choice_log_probs``).
        """
        from openmanus_rl_core.algorithms import masked_mean, uses_reference
        from openmanus_rl_core.distributed.sharding import cat_rows

        algo, mode = self.algo, self.old_log_probs_mode
        mini = self.cfg.actor.ppo_mini_batch_size
        multi = self.cfg.actor.ppo_epochs > 1 or (mini is not None and mini < len(batch))
        with_ref = uses_reference(algo)  # a KL term, or the teacher of on-policy distillation
        need_old = mode == "true" or (mode == "auto" and multi) or algo.use_kl_in_reward
        if mode == "rollout" or self.correction == "behaviour":  # the ratio against the policy that sampled
            batch["old_log_probs"] = batch["rollout_log_probs"]
            need_old = False
        if need_old or with_ref:
            lean, pad = self._lean_shards(batch)
            with self.timer("old_log_prob"):
                outs = self.actor.call_each("compute_log_probs", [(s,) for s in lean], with_ref=with_ref,
                                            with_old=need_old)
            if need_old:
                batch["old_log_probs"] = cat_rows([o["old_log_probs"] for o in outs], pad)
            if with_ref:
                batch["ref_log_probs"] = cat_rows([o["ref_log_probs"] for o in outs], pad)
            if "ref_choice_log_probs" in outs[0]:
                batch["ref_choice_log_probs"] = cat_rows([o["ref_choice_log_probs"] for o in outs], pad)
        if "old_log_probs" in batch:
            diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()
            metrics["actor/rollout_logprob_diff"] = float(masked_mean(diff, batch["response_mask"].bool()))

    def phase_values(self, batch) -> None:
        """The critic's ``values`` (only with a critic)."""
        from openmanus_rl_core.distributed.sharding import cat_rows

        if self.critic is None:
            return
        lean, pad = self._lean_shards(batch)
        with self.timer("values"):
            vals = self.critic.call_each("compute_values", [(s,) for s in lean])
        batch["values"] = cat_rows(vals, pad)

    def phase_advantages(self, batch, metrics: dict[str, float]) -> None:
        """``token_level_rewards`` (the scores, minus ``beta * kl`` with a KL reward penalty), then ``advantages``
        and ``returns`` from the estimator ``algorithm.adv_estimator`` (with ``algorithm.all_action_coeff`` the value
        table also writes each allowed token's value, ``choice_values``)."""
        from openmanus_rl_core.algorithms import apply_kl_penalty

        algo = self.algo
        if algo.use_kl_in_reward:
            rewards, mean_kl = apply_kl_penalty(batch["token_level_scores"], batch["old_log_probs"],
                                                batch["ref_log_probs"], batch["response_mask"], self.kl_ctrl.value,
                                                algo.kl_penalty)
            batch["token_level_rewards"] = rewards
            metrics["actor/reward_kl"] = mean_kl
            metrics["actor/kl_coef"] = float(self.kl_ctrl.value)
            self.kl_ctrl.update(mean_kl, len(batch))
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        with self.timer("adv"):
            adv_cfg = {k: v for k, v in dataclasses.asdict(algo).items() if not isinstance(v, Mapping)}
            advantages, returns = self.estimator(batch, **adv_cfg)
        batch["advantages"] = advantages.float()
        batch["returns"] = returns.float()
        m = batch["response_mask"].bool()
        if m.any():
            metrics["train/advantages_mean"] = float(advantages[m].mean())
            metrics["train/advantages_abs_mean"] = float(advantages[m].abs().mean())
            rows = m.any(-1)  # samples with tokens to train (padding rows and env errors have none)
            zero = ((advantages.abs() * m).sum(-1) == 0) & rows
            metrics["train/zero_adv_frac"] = float(zero.sum()) / float(rows.sum())

    def phase_update_critic(self, batch, step: int, metrics: dict[str, float]) -> None:
        """The critic's update on ``values`` and ``returns`` (only with a critic)."""
        from openmanus_rl_core.distributed.sharding import shard_batch

        if self.critic is None:
            return
        shards, _ = shard_batch(critic_batch(batch), self.critic.size)
        with self.timer("update_critic"):
            metrics.update(_avg(self.critic.call_each("update", [(s, step) for s in shards])))

    def phase_update_actor(self, batch, step: int, metrics: dict[str, float]) -> None:
        """The policy update on ``advantages`` (and old / reference log-probs where the step has them)."""
        from openmanus_rl_core.distributed.sharding import shard_batch

        with self.timer("update_actor"):
            if self.overlap is not None:  # the gradients are in: only the step is left
                ams = self.overlap.step()
            else:
                shards, _ = shard_batch(actor_batch(batch, self.correction), self.actor.size)
                ams = self.actor.call_each("update", [(s, step) for s in shards])
        metrics.update(_avg(ams))
        self.skipped_steps += int(max(a.get("actor/skipped_updates", 0.0) for a in ams))

    def phase_sync_weights(self) -> None:
        """The updated weights into every actor rank's rollout engine."""
        self.policy_version += 1
        with self.timer("sync_weights"):
            self.actor.call("sync_rollout_weights", version=self.policy_version)

    def _lean_shards(self, batch):
        """``(shards, pad)``: the batch's token tensors only, one equal shard per rank (forward passes need no more)."""
        from openmanus_rl_core.distributed.sharding import shard_batch

        return shard_batch(lean_batch(batch), self.actor.size)

    # ------------------------------------------------------------------------------------------------ fit
    def fit(self) -> dict[str, float]:
        from openmanus_rl_core.run.metrics import LearningSignalWatch, MetricsLogger, plot_rewards
        from openmanus_rl_core.run.progress import ProgressBar
        from openmanus_rl_core.distributed.worker_group import WorkerGroupError

        tcfg = self.cfg.trainer
        self.stop.install(f"continue with: openmanus-rl train trainer.run_dir={self.run_dir} trainer.resume=auto")
        self.skipped_steps = 0
        start_step = 0
        if self.resume_path is not None:
            start_step = restore(self, self.resume_path, self._resume_state)
            self._resume_state = None
            self.log(f"resumed from {self.resume_path} (step {start_step})")
        # Resumed: the lines logged after the checkpoint go (those steps run again). A fresh start finds no earlier
        # steps here (_resume_point set them aside), at most a torn line.
        self.metrics_logger = MetricsLogger(self.run_dir, tensorboard="tensorboard" in tcfg.loggers,
                                            resume_step=start_step if self.resume_path is not None else -1)
        self.pm.hook.openmanus_rl_run_start(cfg=self.cfg_node, run_dir=str(self.run_dir))
        val_freq, save_freq = tcfg.val_freq, tcfg.save_freq
        last, last_val = {}, {}
        try:
            if self.resume_path is None:
                first = step_zero(self)
                if first:
                    first["time/elapsed_s"] = time.perf_counter() - self.t_start
                    self.metrics_logger.log(0, first)
                    last_val = {k: v for k, v in first.items() if k.startswith("val/")}
                if not self.total_steps:  # the warm-up alone: its validation is the result, step 0 the checkpoint
                    last, last_val = first, {k[len("warmup/"):]: v for k, v in first.items() if k.startswith("warmup/val/")}
                if (not self.total_steps and tcfg.save_at_end) or self.dumps is not None:  # dumps replay from step 0
                    save(self, 0)
            self.bar = ProgressBar(self.total_steps, initial=start_step, disable=not tcfg.progress,
                                   log_path=self.run_dir / "train.log")
            self.log.bar = self.bar.bar
            ckpt_seconds = None
            restarts = 0
            signal_watch = LearningSignalWatch(tcfg.no_signal_warn_steps, warmup_hint=self.can_warm_up)
            step, saved_step = start_step + 1, start_step
            self.stop.interrupt = False  # from here a signal ends the step in progress, then saves
            while step <= self.total_steps and not self.stop.requested:
                try:
                    metrics = self.train_step(step)
                    is_last = step == self.total_steps
                    if (val_freq and step % val_freq == 0) or (is_last and tcfg.val_at_end):
                        val = self.stop.unless_stopped(validate, self, step)  # stopping: the step stays, unvalidated
                        metrics.update(val)
                        last_val = {k: v for k, v in val.items() if k.startswith("val/")} or last_val
                    metrics["time/elapsed_s"] = time.perf_counter() - self.t_start
                    if ckpt_seconds is not None:  # the previous checkpoint's write time
                        metrics["timing/checkpoint"] = ckpt_seconds
                        ckpt_seconds = None
                    # Logged before the checkpoint: a kill in between resumes from the previous checkpoint and the
                    # logger drops the lines after it, so no step is ever missing from metrics.jsonl.
                    self.metrics_logger.log(step, metrics)
                    self.pm.hook.openmanus_rl_step_end(step=step, metrics=metrics)
                    self.bar.update(step, metrics)
                    warning = signal_watch.update(step, metrics)
                    if warning:
                        self.log(warning)
                    last = metrics
                    if (save_freq and step % save_freq == 0) or (is_last and tcfg.save_at_end):
                        t0 = time.perf_counter()
                        save(self, step)
                        ckpt_seconds = time.perf_counter() - t0
                        saved_step = step
                    step += 1
                except Abandoned:  # a stop signal gave this step's rollout up: not trained on, not logged
                    self.log(f"step {step} abandoned: the run is stopping")
                    break
                except WorkerGroupError as err:
                    restarts += 1
                    saved_step = restart_workers(self, err, restarts)
                    step, ckpt_seconds = saved_step + 1, None
            if self.stop.requested and step - 1 > saved_step:  # stopped by a signal: keep the steps done
                save(self, step - 1)
            final = {**last, **last_val}
            if restarts:
                final["train/worker_restarts"] = float(restarts)
            return final
        finally:
            self.stop.restore()
            if self.stream is not None:
                try:
                    self.stream.close()
                except Exception as exc:  # the workers may be gone already (a failure being reported)
                    self.log(f"could not stop the rollout stream: {exc}")
                self.stream = None
            if self.bar is not None:
                self.bar.close()
                self.log.bar = None
            self.metrics_logger.close()
            try:
                plot = plot_rewards(self.run_dir)
                self.log(f"reward plot: {plot}")
            except Exception as exc:  # a plot must never fail the run
                self.log(f"could not draw the reward plot: {exc}")
            self.pm.hook.openmanus_rl_run_end(run_dir=str(self.run_dir), metrics=dict(last))

    def shutdown(self) -> None:
        for g in (g for g in (self.actor, self.critic) if g is not None):
            g.kill()
        if self.ray_started:  # imported only then: a stop in the middle of `import ray` leaves it half imported
            import ray

            if ray.is_initialized():
                ray.shutdown()
        if self.env_service is not None:  # after the workers: no env call is left in flight
            self.env_service.close()
        heap.unfreeze()  # frozen at the end of set-up


def _avg(items: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = items[0].keys() if items else []
    return {k: mean([it[k] for it in items if k in it]) for k in keys}


