"""The trainer: ``openmanus-rl train`` (the fit loop) and ``openmanus-rl eval``.

One training step (the driver process orchestrates; the heavy work runs in Ray worker groups)::

    tasks (parquet, TaskSampler) --expand n--> shards, one per actor rank
      -> rollout on every rank (its own HFEngine and envs)                        timing/rollout
      -> hooks: process_trajectories                                               (driver)
      -> reward composer (weighted components) -> allocator -> token_level_scores  timing/reward
      -> old / reference log-probs (actor FSDP forward), values (critic)          timing/old_log_prob, timing/values
      -> KL: reward penalty (token_level_rewards = scores - beta * kl) or a loss term
      -> advantages (estimator by name: grpo, gae, gigpo, ...)                     timing/adv
      -> critic update (PPO), actor update (mini-batches x ppo_epochs, grad clip)  timing/update_critic, update_actor
      -> new weights gathered and pushed into every rank's rollout engine          timing/sync_weights
      -> metrics (metrics.jsonl, TensorBoard, progress bar), validation, checkpoint

The embedded default (``openmanus-rl train`` with no overrides) builds a tiny Qwen2-style model and a tokenizer
trained on the env's oracle episodes, validates it untrained (step 0), runs a short supervised warm-up on oracle
demonstrations (``warmup/*`` metrics), then trains with GRPO.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from openmanus_rl_core.config import check
from openmanus_rl_core.protocols import TERMINATIONS
from openmanus_rl_core.schema import Config

__all__ = ["train", "evaluate", "Trainer"]


# ------------------------------------------------------------------------------------------------ helpers


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _split(items: Sequence[Any], n: int) -> list[list[Any]]:
    """``n`` consecutive parts whose sizes differ by at most one (order kept: part r goes to rank r)."""
    base, extra = divmod(len(items), n)
    out, start = [], 0
    for r in range(n):
        stop = start + base + (1 if r < extra else 0)
        out.append(list(items[start:stop]))
        start = stop
    return out


def _shard_batch(batch, n: int):
    """Equal shards for ``n`` ranks (FSDP needs every rank to run the same number of forward passes).

    Rows added to make the size divisible are copies whose ``response_mask`` is zeroed and whose ``valid`` flag
    is cleared (they train nothing). Returns ``(shards, pad)``.
    """
    padded, pad = batch.pad_to_divisor(n)
    if pad:
        for key, off in (("response_mask", 0), ("valid", False)):
            if key in padded:
                cleared = padded[key].clone()
                cleared[-pad:] = off
                padded[key] = cleared
    return padded.chunk(n), pad


def _cat_rows(parts: Sequence[Any], pad: int):
    import torch

    out = torch.cat(list(parts), dim=0)
    return out[: out.shape[0] - pad] if pad else out


def _mean(xs: Sequence[float]) -> float:
    xs = [float(x) for x in xs]
    return float(sum(xs) / len(xs)) if xs else float("nan")


def _quiet_transformers() -> None:
    """transformers' progress bars (saving / loading the model) would clutter the console."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # an old transformers without these: only cosmetic
        pass


PREVIOUS_DIR = "previous"
# What a run leaves in its run directory that a fresh start would overwrite.
_HISTORY = ("checkpoints", "metrics.jsonl", "tensorboard", "config.json", "rewards.png")


def _run_history(run_dir: Path) -> str:
    """What of an earlier run ``run_dir`` holds (its checkpoints, its logged steps), in words; "" when nothing."""
    from openmanus_rl_core.checkpoint import list_checkpoints
    from openmanus_rl_core.metrics import read_metrics

    parts = []
    ckpts = list_checkpoints(run_dir)
    if ckpts:
        parts.append(f"checkpoints {', '.join(p.name for _, p in ckpts)}")
    steps = [r["step"] for r in read_metrics(run_dir) if isinstance(r.get("step"), int)]
    if steps:
        parts.append(f"metrics.jsonl with steps {min(steps)}..{max(steps)}")
    return "; ".join(parts)


def _set_aside_history(run_dir: Path, why: str, log) -> Path | None:
    """Move an earlier run's checkpoints, metrics and TensorBoard logs to ``run_dir/previous/<time>/`` (nothing is
    deleted); the moved-to folder, or None when there was no history."""
    history = _run_history(run_dir)
    if not history:
        return None
    stem = run_dir / PREVIOUS_DIR / time.strftime("%Y%m%d-%H%M%S")
    dest, i = stem, 0
    while dest.exists():
        i += 1
        dest = stem.with_name(f"{stem.name}-{i}")
    dest.mkdir(parents=True)
    for name in _HISTORY:
        if (run_dir / name).exists():
            os.rename(run_dir / name, dest / name)
    log(f"{why}: starting fresh; the earlier run's {history} moved to {dest}")
    return dest


class _Log:
    """Console lines that do not break the progress bar."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)


# ------------------------------------------------------------------------------------------------- Trainer
class Trainer:
    """The driver of one run: builds everything from the config, then :meth:`fit`."""

    def __init__(self, cfg: Any):
        _quiet_transformers()
        self.cfg_node = cfg  # as composed (the run_start hook gets it)
        self.cfg: Config = check(cfg)
        self.log = _Log()
        self.ray_started = False
        self.resume_path: Path | None = None
        self._resume_state: dict | None = None  # the checkpoint read by setup, until fit hands it to the workers
        self.actor = None
        self.critic = None
        self.metrics_logger = None
        self.bar = None
        self.env_service = None
        self.can_warm_up = True  # False once the warm-up found no demonstrations (no oracle, none in the data)

    # ------------------------------------------------------------------------------------------- set-up
    def setup(self) -> None:
        import torch

        from openmanus_rl_core.data import TaskSampler, ensure_task_files, load_tasks, require_tasks
        from openmanus_rl_core.envs import EnvErrorWatch, open_env_service
        from openmanus_rl_core.metrics import make_run_dir
        from openmanus_rl_core.plugins import make_plugin_manager
        from openmanus_rl_core.registry import build, registry
        from openmanus_rl_core.rewards import RewardComposer

        cfg = self.cfg
        self.t_start = time.perf_counter()
        self.seed = cfg.seed
        _seed_all(self.seed)
        torch.set_num_threads(cfg.trainer.driver_threads or os.cpu_count() or 1)
        self.total_steps = cfg.trainer.total_steps
        self.run_dir = make_run_dir(cfg)
        self.resume_path, self._resume_state = self._resume_point(cfg.trainer.resume)
        (self.run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
        self.pm = make_plugin_manager()

        # The env's servers: checked (or started, by this process only) before any model or tokenizer is built.
        # Every env, here and in the workers, is built from the kwargs the service hands back (servers by URL).
        self.env_service = open_env_service(cfg.env.name, registry("env").get(cfg.env.name), cfg.env.kwargs)
        cfg.env.kwargs = self.env_service.kwargs
        self.env_errors = EnvErrorWatch(cfg.trainer.max_env_error_steps, self.env_service.check)

        # Task files: configured, or generated into the run directory (deterministic, so a resumed run
        # regenerates the very same files).
        data_dir = self.run_dir / "data"
        train_files, val_files = ensure_task_files(cfg, data_dir)
        self.train_tasks = load_tasks(train_files)
        self.val_tasks = load_tasks(val_files)
        tcfg = cfg.trainer
        validation = {k: getattr(tcfg, k) for k in ("val_freq", "val_before_train", "val_at_end")}
        if any(validation.values()):  # an empty set would log val/* as null at every validation, silently
            settings = " ".join(f"trainer.{k}={v}" for k, v in validation.items())
            require_tasks(self.val_tasks, val_files, f"the run validates ({settings}); give validation tasks "
                          f"(data.val_files, or env.val_tasks > 0) or turn validation off (trainer.val_freq=0 "
                          f"trainer.val_before_train=false trainer.val_at_end=false)")
        if tcfg.val_max_tasks:
            self.val_tasks = self.val_tasks[: tcfg.val_max_tasks]
        self.sampler = TaskSampler(self.train_tasks, cfg.data.train_batch_size, seed=cfg.data.seed,
                                   shuffle=cfg.data.shuffle)

        # Components used on the driver.
        self.template = build("template", cfg.template)
        self.env_factory = lambda: build("env", cfg.env)
        self.composer = RewardComposer.from_config(cfg.reward.components)
        self.allocator = build("allocator", cfg.allocator)
        self.algo = cfg.algorithm
        self.n = cfg.rollout.n
        self.estimator = registry("advantage").get(self.algo.adv_estimator)
        self.use_critic = self.algo.use_critic
        # Old log-probs of the PPO ratio: auto (recomputed by the actor only when the update is off-policy within
        # a step), true (always recomputed), false (never), rollout (the engine's sampling log-probs).
        self.old_log_probs_mode = self.algo.recompute_old_log_probs
        self.kl_ctrl = self._kl_controller()

        # The model every worker loads: a local HF folder, or the embedded tiny model built now.
        self.model_dir, self.tokenizer = self._prepare_model()
        self.pad_token_id = self.tokenizer.pad_token_id
        self._start_workers()

    def _resume_point(self, resume: Any) -> tuple[Path | None, dict | None]:
        """``(checkpoint folder, its state)`` to resume from, or ``(None, None)`` to start fresh.

        ``auto``: the newest checkpoint of the run directory that verifies and loads (a refused one falls back to
        the one before, with a warning); ``never``: a fresh start; a path: that checkpoint (or a run directory's
        newest). Nothing of an earlier run is overwritten unasked: with checkpoints that all fail to load, auto
        stops with an error listing them; a fresh start over an earlier run's history needs ``never``, which moves
        that history under ``previous/``.
        """
        from openmanus_rl_core.checkpoint import CheckpointError, load_latest_checkpoint, open_checkpoint

        mode = str(resume).lower() if resume is not None else "null"  # YAML turns true/false/null into non-strings
        start_over = (f"To start over anyway, use a new trainer.run_dir, or trainer.resume=never (the earlier "
                      f"checkpoints and metrics are then moved to {self.run_dir / PREVIOUS_DIR}/).")
        if mode in ("auto", "true"):
            try:
                found = load_latest_checkpoint(self.run_dir, warn=lambda m: self.log(f"WARNING: {m}"))
            except CheckpointError as exc:
                raise CheckpointError(f"trainer.resume=auto: {exc}\nNothing in {self.run_dir} was changed. "
                                      f"{start_over}") from None
            if found is not None:
                return found
            _set_aside_history(self.run_dir, "trainer.resume=auto found no checkpoint", self.log)
            return None, None
        if mode == "never":
            _set_aside_history(self.run_dir, "trainer.resume=never", self.log)
            return None, None
        if mode in ("null", "none", "false", ""):
            history = _run_history(self.run_dir)
            if history:
                raise CheckpointError(f"trainer.run_dir={self.run_dir} already holds a run ({history}) and "
                                      f"trainer.resume is not set. Continue it with trainer.resume=auto. {start_over}")
            return None, None
        return open_checkpoint(str(resume))

    def _kl_controller(self):
        from openmanus_rl_core.algorithms import make_kl_controller

        return make_kl_controller(**dataclasses.asdict(self.algo.kl_ctrl))

    def _prepare_model(self):
        from openmanus_rl_core.models import load_model_and_tokenizer, load_tokenizer
        from openmanus_rl_core.warmup import build_corpus

        cfg = self.cfg
        if cfg.model.path:
            model_dir = Path(cfg.model.path).expanduser()
            if not model_dir.exists():
                raise FileNotFoundError(f"model.path={cfg.model.path!r} does not exist; give a local Hugging Face "
                                        "model folder")
        else:
            model_dir = Path(cfg.model.save_dir or self.run_dir / "model")
            # What the built model depends on; a folder built from something else is rebuilt.
            recipe = json.dumps({"tiny": dataclasses.asdict(cfg.model.tiny), "dtype": cfg.model.dtype,
                                 "env": dataclasses.asdict(cfg.env), "template": dataclasses.asdict(cfg.template),
                                 "corpus_tasks": cfg.model.corpus_tasks,
                                 "train_tasks": [[t["task_id"], t["seed"]] for t in self.train_tasks]},
                                sort_keys=True, default=str)
            stamp = model_dir / "omrl_recipe.json"
            if not (model_dir / "config.json").exists() or not stamp.exists() or stamp.read_text() != recipe:
                t0 = time.perf_counter()
                corpus_tasks = self.train_tasks[:cfg.model.corpus_tasks or len(self.train_tasks)]
                corpus = build_corpus(self.env_factory, self.template, corpus_tasks, cfg.rollout.max_turns)
                load_model_and_tokenizer(cfg.model, corpus, save_dir=model_dir)
                stamp.write_text(recipe)
                self.log(f"built the tiny model and its tokenizer ({len(corpus)} corpus texts) in "
                         f"{time.perf_counter() - t0:.1f}s: {model_dir}")
        return str(model_dir), load_tokenizer(str(model_dir))

    def worker_classes(self) -> tuple[type, type]:
        """The actor and critic worker classes (tests return subclasses that inject faults)."""
        from openmanus_rl_core.workers import ActorWorker, CriticWorker

        return ActorWorker, CriticWorker

    def _start_workers(self) -> None:
        import ray

        from openmanus_rl_core.distributed.ray_node import start_ray
        from openmanus_rl_core.distributed.worker_group import WorkerGroup

        tcfg = self.cfg.trainer
        if not ray.is_initialized():
            start_ray(tcfg.ray_address, tcfg.num_cpus or os.cpu_count() or 1, log_to_driver=tcfg.log_to_driver,
                      configure_logging=True, logging_level="warning")
            self.ray_started = True
        W = tcfg.num_workers
        groups = 2 if self.use_critic else 1
        cpus = tcfg.worker_num_cpus
        if cpus is None:  # share what the cluster has among every worker (logical CPUs only schedule actors)
            total = float(ray.cluster_resources().get("CPU", 1.0))
            cpus = min(1.0, total / (W * groups))
        gpus = tcfg.worker_num_gpus
        if gpus is None:
            have_gpu = float(ray.cluster_resources().get("GPU", 0.0)) > 0 and tcfg.device != "cpu"
            gpus = (1.0 / groups) if have_gpu else 0.0
        have_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        if gpus and W * groups * float(gpus) > have_gpus + 1e-9:
            raise RuntimeError(
                f"trainer.num_workers={W} ({groups} group(s), {gpus} GPU each) needs {W * groups * float(gpus):g} GPUs "
                f"but the Ray cluster has {have_gpus:g}; set trainer.num_workers to at most the GPU count "
                f"(NCCL cannot put two ranks of one group on one GPU) or trainer.device=cpu")
        t0 = time.perf_counter()
        strategy = tcfg.placement_strategy
        actor_cls, critic_cls = self.worker_classes()
        self.actor = WorkerGroup(actor_cls, W, self.cfg, num_cpus=float(cpus), num_gpus=float(gpus), name="actor",
                                 placement_strategy=strategy, model_dir=self.model_dir, total_steps=self.total_steps)
        if self.use_critic:
            self.critic = WorkerGroup(critic_cls, W, self.cfg, num_cpus=float(cpus), num_gpus=float(gpus),
                                      name="critic", placement_strategy=strategy, model_dir=self.model_dir,
                                      total_steps=self.total_steps)
        info = self.actor.setup_info[0]
        self.log(f"{W} actor worker(s){' + ' + str(W) + ' critic worker(s)' if self.critic else ''} ready on "
                 f"{info['device']} in {time.perf_counter() - t0:.1f}s; policy parameters: {info['params']:,}")

    # --------------------------------------------------------------------------------------- rollout
    def _rollout(self, tasks: list[dict], overrides: Mapping[str, Any] | None = None, keep_rng: bool = False):
        shards = _split(tasks, self.actor.size)
        parts = self.actor.call_each("rollout", [(s,) for s in shards], overrides=overrides, keep_rng=keep_rng)
        return [ep for part in parts for ep in part]

    def validate(self, step: int, prefix: str = "val") -> dict[str, float]:
        """Greedy (or low-temperature) episodes on every validation task: ``<prefix>/reward_mean``,
        ``<prefix>/success_rate`` and the reward breakdown. The sampling RNG is left untouched."""
        from openmanus_rl_core.rollout import expand_tasks, rollout_metrics

        t0 = time.perf_counter()
        tasks = [dict(t, group_id=f"val:{i}") for i, t in enumerate(self.val_tasks)]
        tasks = expand_tasks(tasks, 1)
        overrides = {"n": 1, "greedy": self.cfg.trainer.val_greedy, "temperature": self.cfg.trainer.val_temperature}
        episodes = self._rollout(tasks, overrides, keep_rng=True)
        trajs = [e.trajectory for e in episodes]
        breakdowns, rmetrics = self.composer.compose_batch(trajs)
        out = {
            f"{prefix}/reward_mean": _mean([b.total for b in breakdowns]),
            f"{prefix}/success_rate": _mean([bool(t.success) for t in trajs]),
            f"{prefix}/num_turns": _mean([t.num_turns for t in trajs]),
            f"{prefix}/response_length": _mean([sum(e.response_mask) for e in episodes]),
        }
        out.update({f"{prefix}/{k}": v for k, v in rmetrics.items() if k.endswith("/mean")})
        ro = rollout_metrics(episodes)
        for name in TERMINATIONS:
            if f"rollout/termination/{name}" in ro:
                out[f"{prefix}/termination/{name}"] = ro[f"rollout/termination/{name}"]
        out[f"timing/{prefix}"] = time.perf_counter() - t0
        if self.cfg.trainer.val_samples_to_log:
            for e in episodes[:self.cfg.trainer.val_samples_to_log]:
                self.log(f"  [{prefix} sample] task {e.trajectory.task_id}: "
                         + " | ".join(repr(t.response) for t in e.trajectory.turns))
        return out

    # ------------------------------------------------------------------------------------------ warm-up
    def warmup(self) -> dict[str, float]:
        from openmanus_rl_core.warmup import build_demonstrations, run_warmup

        wcfg = self.cfg.warmup
        if not wcfg.enabled or wcfg.steps <= 0:
            return {}
        t0 = time.perf_counter()
        # Demonstrations come from the training tasks only (never the validation tasks).
        demo_tasks = self.train_tasks[:wcfg.num_demos or len(self.train_tasks)]
        demos = build_demonstrations(self.env_factory, self.template, self.tokenizer, demo_tasks,
                                     self.cfg.rollout.max_turns)
        if not demos:
            self.can_warm_up = False
            self.log(f"warm-up skipped: env {self.cfg.env.name!r} has no oracle and the training tasks carry "
                     f"no demonstrations (warmup.enabled=false silences this)")
            return {}

        def step_fn(shards, lr):
            return self.actor.call_each("sft_update", [(s, lr, wcfg.grad_clip) for s in shards])

        metrics = run_warmup(step_fn, demos, self.pad_token_id, self.actor.size, wcfg.steps, wcfg.batch_size,
                             wcfg.lr, self.seed, wcfg.warmup_ratio, log=self.log, lr_schedule=wcfg.lr_schedule)
        self.actor.call("end_warmup")
        self.actor.call("sync_rollout_weights")
        metrics["warmup/seconds"] = time.perf_counter() - t0
        metrics["warmup/from_data"] = float(sum(bool(t.get("demonstration")) for t in demo_tasks))
        return metrics

    # -------------------------------------------------------------------------------------- one step
    def train_step(self, step: int) -> dict[str, float]:
        from openmanus_rl_core.algorithms import apply_kl_penalty, masked_mean
        from openmanus_rl_core.metrics import Timer
        from openmanus_rl_core.rollout import build_batch, expand_tasks, rollout_metrics

        algo = self.algo
        timer = Timer()
        metrics: dict[str, float] = {}
        W = self.actor.size
        with timer("step"):
            tasks = self.sampler.next_batch()
            # Deterministic group ids (expand_tasks would draw random ones): same run, same groups.
            tasks = [dict(t, group_id=f"{step}:{i}") for i, t in enumerate(tasks)]
            expanded = expand_tasks(tasks, self.n)
            with timer("rollout"):
                episodes = self._rollout(expanded)
            trajectories = [e.trajectory for e in episodes]
            self.env_errors.update(step, [t.termination for t in trajectories], [t.error for t in trajectories])
            self.pm.hook.openmanus_rl_process_trajectories(trajectories=trajectories, step=step)
            with timer("reward"):
                breakdowns, reward_metrics = self.composer.compose_batch(trajectories)
                batch = build_batch(episodes, breakdowns, self.allocator, self.pad_token_id,
                                    self.cfg.rollout.keep_env_errors)
            ro_metrics = rollout_metrics(episodes, elapsed_s=timer.timings["rollout"])
            self.pm.hook.openmanus_rl_rollout_end(trajectories=trajectories,
                                                  metrics={**reward_metrics, **ro_metrics}, step=step)
            totals = [b.total for b in breakdowns]
            metrics["train/reward_mean"] = _mean(totals)
            metrics["train/reward_std"] = float(np.std(totals)) if totals else float("nan")
            metrics["train/success_rate"] = _mean([bool(t.success) for t in trajectories])
            metrics["train/num_turns"] = _mean([t.num_turns for t in trajectories])
            metrics["train/response_length"] = _mean([sum(e.response_mask) for e in episodes])
            metrics.update({f"train/{k}": v for k, v in reward_metrics.items()})
            metrics.update(ro_metrics)

            keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
            shards, pad = _shard_batch(batch, W)
            lean = [s.select(keys) for s in shards]
            # Old log-probs: recomputed when the update is off-policy within the step (several mini-batches or
            # epochs) or when a KL penalty needs them; otherwise the update uses the detached current ones.
            mini = self.cfg.actor.ppo_mini_batch_size
            multi = self.cfg.actor.ppo_epochs > 1 or (mini is not None and mini < len(batch))
            recompute = self.old_log_probs_mode
            use_kl_reward = algo.use_kl_in_reward
            use_kl_loss = algo.use_kl_loss
            from_rollout = recompute == "rollout"  # the engine's sampling log-probs as the behaviour policy
            need_old = (recompute == "true") or (recompute == "auto" and multi) or use_kl_reward
            if from_rollout:
                batch["old_log_probs"] = batch["rollout_log_probs"]
            elif need_old or use_kl_reward or use_kl_loss:
                with timer("old_log_prob"):
                    outs = self.actor.call_each("compute_log_probs", [(s,) for s in lean],
                                                with_ref=use_kl_reward or use_kl_loss, with_old=need_old)
                if need_old:
                    batch["old_log_probs"] = _cat_rows([o["old_log_probs"] for o in outs], pad)
                if use_kl_reward or use_kl_loss:
                    batch["ref_log_probs"] = _cat_rows([o["ref_log_probs"] for o in outs], pad)
            if "old_log_probs" in batch:
                diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()
                metrics["actor/rollout_logprob_diff"] = float(masked_mean(diff, batch["response_mask"].bool()))

            # Critic values.
            if self.critic is not None:
                with timer("values"):
                    vals = self.critic.call_each("compute_values", [(s,) for s in lean])
                batch["values"] = _cat_rows(vals, pad)

            # KL as a reward penalty, or the plain scores.
            if use_kl_reward:
                rewards, mean_kl = apply_kl_penalty(batch["token_level_scores"], batch["old_log_probs"],
                                                    batch["ref_log_probs"], batch["response_mask"],
                                                    self.kl_ctrl.value, algo.kl_penalty)
                batch["token_level_rewards"] = rewards
                metrics["actor/reward_kl"] = mean_kl
                metrics["actor/kl_coef"] = float(self.kl_ctrl.value)
                self.kl_ctrl.update(mean_kl, len(batch))
            else:
                batch["token_level_rewards"] = batch["token_level_scores"]

            with timer("adv"):
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

            shards, pad = _shard_batch(batch, W)
            if self.critic is not None:
                with timer("update_critic"):
                    ckeys = keys + ["values", "returns"]
                    cms = self.critic.call_each("update", [(s.select(ckeys), step) for s in shards])
                metrics.update(_avg(cms))
            if step > self.cfg.critic.warmup_steps:
                with timer("update_actor"):
                    akeys = keys + ["advantages"] + [k for k in ("old_log_probs", "ref_log_probs") if k in batch]
                    ams = self.actor.call_each("update", [(s.select(akeys), step) for s in shards])
                am = _avg(ams)
                metrics.update(am)
                self.skipped_steps += int(max(a.get("actor/skipped_updates", 0.0) for a in ams))
                with timer("sync_weights"):
                    self.actor.call("sync_rollout_weights")
            metrics["train/skipped_steps"] = float(self.skipped_steps)

        # Throughput: every token the step processed (prompts + responses, no padding), and generated tokens.
        step_s = timer.timings["step"]
        tokens = float(batch["attention_mask"].sum())
        gen_tokens = float(batch["response_mask"].sum())
        metrics["perf/tokens_per_s"] = tokens / step_s if step_s > 0 else float("nan")
        metrics["perf/gen_tokens_per_s"] = gen_tokens / max(timer.timings.get("rollout", 0.0), 1e-9)
        metrics["perf/samples_per_s"] = len(batch) / step_s if step_s > 0 else float("nan")
        metrics["perf/samples"] = float(len(batch))
        metrics.update(timer.metrics())
        return metrics

    # ---------------------------------------------------------------------------------------- checkpoint
    def save(self, step: int) -> Path:
        from openmanus_rl_core.checkpoint import capture_rng_state, save_checkpoint

        t0 = time.perf_counter()
        actor_states = self.actor.call("get_state")
        state: dict[str, Any] = {
            "model": actor_states[0]["model"],
            "optimizer": actor_states[0]["optimizer"],
            "scheduler": actor_states[0]["scheduler"],
            "rng": {"driver": capture_rng_state(), "actor": [s["rng"] for s in actor_states]},
            "sampler": self.sampler.state_dict(),
            "trainer": {"step": int(step), "skipped_steps": int(self.skipped_steps),
                        "kl_coef": float(self.kl_ctrl.value), "total_steps": int(self.total_steps),
                        "warmup_done": True},
            "meta": {"model_dir": str(self.model_dir), "step": int(step), "config": dataclasses.asdict(self.cfg),
                     "lora": self.cfg.model.lora.enabled},
        }
        if self.critic is not None:
            critic_states = self.critic.call("get_state")
            state["critic"] = {"model": critic_states[0]["model"], "optimizer": critic_states[0]["optimizer"],
                               "scheduler": critic_states[0]["scheduler"]}
            state["rng"]["critic"] = [s["rng"] for s in critic_states]
        path = save_checkpoint(self.run_dir, step, state, keep_last=self.cfg.trainer.max_checkpoints)
        self.log(f"checkpoint: {path} ({time.perf_counter() - t0:.1f}s)")
        return path

    def restore(self, path: Path, state: dict | None = None) -> int:
        """Load the checkpoint's state (``state``, when already read from ``path``) into the workers and the
        driver; returns its step."""
        import ray

        from openmanus_rl_core.checkpoint import load_checkpoint, restore_rng_state

        state = load_checkpoint(path) if state is None else state
        model_ref = ray.put(state["model"])
        optim_ref = ray.put(state["optimizer"])
        rngs = state["rng"]["actor"]
        if len(rngs) != self.actor.size:
            raise RuntimeError(f"{path} was saved by {len(rngs)} actor workers but this run has {self.actor.size}; "
                               f"resume with trainer.num_workers={len(rngs)}")
        self.actor.call_each("load_state", [(model_ref, optim_ref, state["scheduler"], rngs[r])
                                            for r in range(self.actor.size)])
        if self.critic is not None:
            if "critic" not in state:
                raise RuntimeError(f"{path} holds no critic state; it was saved by a run without a critic")
            c = state["critic"]
            cm, co = ray.put(c["model"]), ray.put(c["optimizer"])
            crngs = state["rng"]["critic"]
            self.critic.call_each("load_state", [(cm, co, c["scheduler"], crngs[r]) for r in range(self.critic.size)])
        self.sampler.load_state_dict(state["sampler"])
        t = state["trainer"]
        self.skipped_steps = int(t.get("skipped_steps", 0))
        self.kl_ctrl.value = float(t.get("kl_coef", self.kl_ctrl.value))
        restore_rng_state(state["rng"]["driver"])
        return int(t["step"])

    # ------------------------------------------------------------------------------------------------ fit
    def fit(self) -> dict[str, float]:
        from openmanus_rl_core.metrics import LearningSignalWatch, MetricsLogger, ProgressBar, plot_rewards
        from openmanus_rl_core.distributed.worker_group import WorkerGroupError

        tcfg = self.cfg.trainer
        self.skipped_steps = 0
        start_step = 0
        if self.resume_path is not None:
            start_step = self.restore(self.resume_path, self._resume_state)
            self._resume_state = None
            self.log(f"resumed from {self.resume_path} (step {start_step})")
        # Resumed: the lines logged after the checkpoint go (those steps run again). A fresh start finds no earlier
        # steps here (_resume_point set them aside), at most a torn line.
        self.metrics_logger = MetricsLogger(self.run_dir, tensorboard=tcfg.tensorboard,
                                            resume_step=start_step if self.resume_path is not None else -1)
        self.pm.hook.openmanus_rl_run_start(cfg=self.cfg_node, run_dir=str(self.run_dir))
        val_freq, save_freq = tcfg.val_freq, tcfg.save_freq
        last: dict[str, float] = {}
        last_val: dict[str, float] = {}
        try:
            if self.resume_path is None:
                first: dict[str, float] = {}
                if tcfg.val_before_train:
                    first.update(self.validate(0))
                    self.log(f"step 0 (untrained): val reward {first['val/reward_mean']:.3f}, "
                             f"success {first['val/success_rate']:.3f}")
                wm = self.warmup()
                if wm:
                    first.update(wm)
                    msg = f"warm-up: {int(wm['warmup/steps'])} steps in {wm['warmup/seconds']:.1f}s, loss {wm['warmup/loss']:.4f}"
                    if self.cfg.warmup.validate:
                        post = self.validate(0, prefix="warmup/val")
                        first.update(post)
                        msg += (f"; val reward after warm-up {post['warmup/val/reward_mean']:.3f}, "
                                f"success {post['warmup/val/success_rate']:.3f}")
                    self.log(msg)
                if first:
                    first["time/elapsed_s"] = time.perf_counter() - self.t_start
                    self.metrics_logger.log(0, first)
                    last_val = {k: v for k, v in first.items() if k.startswith("val/")}
            self.bar = ProgressBar(self.total_steps, initial=start_step,
                                   disable=not tcfg.progress)
            self.log.bar = self.bar.bar
            ckpt_seconds = None
            restarts = 0
            signal_watch = LearningSignalWatch(tcfg.no_signal_warn_steps, warmup_hint=self.can_warm_up)
            step = start_step + 1
            while step <= self.total_steps:
                try:
                    metrics = self.train_step(step)
                    is_last = step == self.total_steps
                    if (val_freq and step % val_freq == 0) or (is_last and tcfg.val_at_end):
                        metrics.update(self.validate(step))
                        last_val = {k: v for k, v in metrics.items() if k.startswith("val/")}
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
                        self.save(step)
                        ckpt_seconds = time.perf_counter() - t0
                    step += 1
                except WorkerGroupError as err:
                    restarts += 1
                    step = self._restart_workers(err, restarts) + 1
                    ckpt_seconds = None
            final = {**last, **last_val}
            if restarts:
                final["train/worker_restarts"] = float(restarts)
            return final
        finally:
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

    def _restart_workers(self, err: Exception, restarts: int) -> int:
        """After a worker failure: new worker groups, state from the newest complete checkpoint; returns its step.

        At most ``trainer.max_worker_restarts`` times per run; without a checkpoint to go back to, the error stands.
        """
        from openmanus_rl_core.checkpoint import CheckpointError, load_latest_checkpoint
        from openmanus_rl_core.metrics import MetricsLogger

        allowed = self.cfg.trainer.max_worker_restarts
        found, why = None, f"trainer.max_worker_restarts={allowed} used up"
        if restarts <= allowed:
            try:
                found = load_latest_checkpoint(self.run_dir)
                why = f"no complete checkpoint in {self.run_dir} to restart from (set trainer.save_freq)"
            except CheckpointError as exc:
                why = str(exc)
        if found is None:
            self.log(f"worker failure, not restarting: {why}")
            raise err
        path, state = found
        self.log(f"{err}\nrestarting the workers ({restarts}/{allowed}) from {path}")
        for g in (self.actor, self.critic):
            if g is not None:
                g.kill()
        self.actor = self.critic = None
        self._start_workers()
        step = self.restore(path, state)
        # The lines logged after that checkpoint are dropped: those steps run again.
        self.metrics_logger.close()
        self.metrics_logger = MetricsLogger(self.run_dir, tensorboard=self.cfg.trainer.tensorboard, resume_step=step)
        return step

    def shutdown(self) -> None:
        import ray

        for g in (self.actor, self.critic):
            if g is not None:
                g.kill()
        if self.ray_started and ray.is_initialized():
            ray.shutdown()
        if self.env_service is not None:  # after the workers: no env call is left in flight
            self.env_service.close()


def _avg(items: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = items[0].keys() if items else []
    return {k: _mean([it[k] for it in items if k in it]) for k in keys}


# ---------------------------------------------------------------------------------------------- commands
def train(cfg: Any) -> int:
    """``openmanus-rl train``: run the fit loop; prints the run directory first and a summary at the end."""
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        final = trainer.fit()
    finally:
        trainer.shutdown()
    elapsed = time.perf_counter() - trainer.t_start
    val_r, val_s = final.get("val/reward_mean"), final.get("val/success_rate")
    summary = f"done: {trainer.total_steps} steps in {elapsed:.0f}s"
    if val_r is not None:
        summary += f"; final val reward {val_r:.3f}, success rate {val_s:.3f}"
    print(summary, flush=True)
    print(f"run directory: {trainer.run_dir}", flush=True)
    return 0


def evaluate(cfg: Any) -> int:
    """``openmanus-rl eval trainer.checkpoint=<checkpoint or run dir>``: run the env's validation tasks.

    Loads the model (from the checkpoint's model folder plus its weights, or ``model.path``) into one in-process
    rollout engine, runs every validation task greedily (``trainer.val_greedy``), and prints the success rate and
    the mean reward (also written as JSON to ``trainer.eval_output`` when set).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.checkpoint import open_checkpoint
    from openmanus_rl_core.data import ensure_task_files, load_tasks, require_tasks
    from openmanus_rl_core.envs import open_env_service
    from openmanus_rl_core.models import _dtype, load_tokenizer, lora_scaling, merge_lora_state
    from openmanus_rl_core.registry import build, registry
    from openmanus_rl_core.rewards import RewardComposer
    from openmanus_rl_core.rollout import AgentLoop, expand_tasks

    _quiet_transformers()
    c = check(cfg, training=False)
    _seed_all(c.seed)
    ckpt = c.trainer.checkpoint
    model_cfg = c.model
    state = None
    if ckpt:
        path, state = open_checkpoint(str(ckpt), keys=["model", "meta"])
        meta = state["meta"] or {}
        model_dir = meta.get("model_dir")
        saved_cfg = meta.get("config") or {}
        if saved_cfg.get("model"):  # LoRA and dtype as the checkpoint was trained
            saved = {k: v for k, v in saved_cfg["model"].items() if k in ("dtype", "lora")}
            model_cfg = dataclasses.replace(c.model, dtype=saved.get("dtype", c.model.dtype),
                                            lora=dataclasses.replace(c.model.lora, **saved.get("lora", {})))
        if not model_dir or not Path(model_dir).exists():
            cand = Path(path).parent.parent / "model"
            if not cand.exists():
                raise FileNotFoundError(f"{path}: its model folder {model_dir!r} is gone and {cand} does not exist; "
                                        "pass model.path=<the HF folder the run started from>")
            model_dir = str(cand)
        print(f"checkpoint: {path} (step {meta.get('step')})")
    elif c.model.path:
        model_dir = str(Path(c.model.path).expanduser())
    else:
        raise SystemExit("eval needs trainer.checkpoint=<checkpoint folder or run directory> or model.path=<HF folder>")

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=_dtype(model_cfg.dtype))
    device = "cuda" if torch.cuda.is_available() and c.trainer.device != "cpu" else "cpu"
    engine = build("engine", {"name": c.rollout.engine, "kwargs": c.rollout.engine_kwargs}, model=model,
                   tokenizer=tokenizer, device=device, seed=c.seed)
    if state is not None:  # a LoRA run's checkpoint holds the adapters: the engine gets them merged
        weights = state["model"]
        engine.update_weights(merge_lora_state(weights, lora_scaling(model_cfg.lora)) if model_cfg.lora.enabled
                              else weights)

    out_dir = Path(c.trainer.run_dir or (Path(ckpt).parent.parent if ckpt else "outputs/eval"))
    val_files = c.data.val_files or ensure_task_files(c, out_dir / "data")[1]
    tasks = require_tasks(load_tasks(val_files), val_files, "eval runs the validation tasks; give a file with tasks "
                          "(data.val_files, or env.val_tasks > 0)")
    if c.trainer.val_max_tasks:
        tasks = tasks[: c.trainer.val_max_tasks]
    template = build("template", c.template)
    rcfg = dataclasses.replace(c.rollout, n=1, greedy=c.trainer.val_greedy, temperature=c.trainer.val_temperature)
    service = open_env_service(c.env.name, registry("env").get(c.env.name), c.env.kwargs)
    c.env.kwargs = service.kwargs
    loop = AgentLoop(engine, tokenizer, template, lambda: build("env", c.env), rcfg)
    t0 = time.perf_counter()
    try:
        episodes = loop.run(expand_tasks([dict(t, group_id=f"eval:{i}") for i, t in enumerate(tasks)], 1))
    finally:
        service.close()
    composer = RewardComposer.from_config(c.reward.components)
    breakdowns, rmetrics = composer.compose_batch([e.trajectory for e in episodes])
    result = {
        "tasks": len(episodes),
        "success_rate": _mean([bool(e.trajectory.success) for e in episodes]),
        "reward_mean": _mean([b.total for b in breakdowns]),
        "num_turns": _mean([e.trajectory.num_turns for e in episodes]),
        "seconds": time.perf_counter() - t0,
        **{k: v for k, v in rmetrics.items() if k.endswith("/mean")},
    }
    print(f"eval on {result['tasks']} {c.env.name} validation tasks: success rate {result['success_rate']:.3f}, "
          f"mean reward {result['reward_mean']:.3f} ({result['seconds']:.1f}s)")
    if c.trainer.eval_output:
        Path(c.trainer.eval_output).parent.mkdir(parents=True, exist_ok=True)
        Path(c.trainer.eval_output).write_text(json.dumps(result, indent=2))
    return 0
