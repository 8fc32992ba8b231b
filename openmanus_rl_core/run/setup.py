"""A run's set-up, before its fit loop: everything :class:`~openmanus_rl_core.run.trainer.Trainer` builds from its
config -- the run directory and resume point, the env's servers, the task files and the sampler, the components
used on the driver (template, reward composer, allocator, advantage estimator, group filter, KL controller), the
model folder and the worker groups."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from typing import Any

import numpy as np

from openmanus_rl_core.process import heap
from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.algorithms.correction import correction_mode
from openmanus_rl_core.algorithms.dynamic_sampling import GroupFilter
from openmanus_rl_core.rewards.callables import RECORD_KEY, record


def seed_all(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    import torch

    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def quiet_transformers() -> None:
    """transformers' progress bars (saving / loading the model) would clutter the console."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # an old transformers without these: only cosmetic
        pass


def train_at_once(cfg: Any) -> int:
    """The most episodes ``train`` plays at once (``cfg``: the typed config): a step's, ``data.train_batch_size`` x
    ``rollout.n`` (with the group stream, ``rollout.max_staleness`` + 1 batches of them may run together), or a
    validation's, every validation task once (``trainer.val_max_tasks`` of them at most), whichever is larger."""
    step = cfg.data.train_batch_size * cfg.rollout.n * (int(cfg.rollout.max_staleness or 0) + 1)
    tc = cfg.trainer
    if not (tc.val_freq or tc.val_before_train or tc.val_at_end or (cfg.warmup.enabled and cfg.warmup.validate)):
        return step
    if cfg.data.val_files:
        from openmanus_rl_core.data.tasks import load_tasks

        val = len(load_tasks(cfg.data.val_files))
    else:  # generated: env.val_tasks, or for a mix each source's
        from openmanus_rl_core.plugin.mix import is_mix, resolve_sources
        from openmanus_rl_core.plugin.registry import registry

        val = (sum(int(s.get("val_tasks") or 0) for s in resolve_sources(cfg.env.kwargs["sources"]).values())
               if is_mix(registry("env").get(cfg.env.name)) else int(cfg.env.val_tasks or 0))
    if tc.val_max_tasks:
        val = min(val, int(tc.val_max_tasks))
    return max(step, val)


def setup(trainer: Any) -> None:
    """Build ``trainer``'s run from its config (the attributes the fit loop reads)."""
    import torch

    from openmanus_rl_core.algorithms import make_kl_controller
    from openmanus_rl_core.data.tasks import load_tasks, require_tasks
    from openmanus_rl_core.plugin.envs import EnvErrorWatch, open_env_service
    from openmanus_rl_core.run.metrics import make_run_dir
    from openmanus_rl_core.run.model_folder import prepare_model_dir
    from openmanus_rl_core.models.loading import check_model, recipe_line
    from openmanus_rl_core.plugin.manager import make_plugin_manager
    from openmanus_rl_core.plugin.registry import build, registry
    from openmanus_rl_core.run.resume import resume_point
    from openmanus_rl_core.rewards.composer import RewardComposer
    from openmanus_rl_core.data.generation import ensure_task_files
    from openmanus_rl_core.data.sources import first_tasks, make_sampler
    from openmanus_rl_core.run.dumps import RolloutDumps
    from openmanus_rl_core.plugin.mix import MixEnv, ratios, source_rewards

    cfg = trainer.cfg
    trainer.t_start = time.perf_counter()
    trainer.seed = cfg.seed
    seed_all(trainer.seed)
    torch.set_num_threads(cfg.trainer.driver_threads or os.cpu_count() or 1)
    trainer.total_steps = cfg.trainer.total_steps
    check_model(cfg.model)  # before anything is created: a bad model or tokenizer is one clear message
    trainer.run_dir = make_run_dir(cfg)
    trainer.resume_path, trainer._resume_state = resume_point(trainer.run_dir, cfg.trainer.resume, trainer.log)
    if not (trainer.run_dir / "config.json").exists():  # the record of the run's first settings, never rewritten
        settings = {**dataclasses.asdict(cfg), RECORD_KEY: record(trainer.python_rewards)}
        (trainer.run_dir / "config.json").write_text(json.dumps(settings, indent=2, default=str))
    trainer.log(recipe_line(cfg, resumed_from=trainer.resume_path))  # after the record: a stop from here continues
    trainer.pm = make_plugin_manager()

    # The env's servers: checked (or started, by this process only) before any model or tokenizer is built.
    # Every env, here and in the workers, is built from the kwargs the service hands back (servers by URL).
    trainer.env_service = open_env_service(cfg.env.name, registry("env").get(cfg.env.name), cfg.env.kwargs,
                                           at_once=train_at_once(cfg), run_dir=trainer.run_dir)
    cfg.env.kwargs = trainer.env_service.kwargs
    trainer.env_errors = EnvErrorWatch(cfg.trainer.max_env_error_steps, trainer.env_service.check)

    # Task files: configured, or generated into the run directory (deterministic, so a resumed run
    # regenerates the very same files).
    data_dir = trainer.run_dir / "data"
    train_files, val_files = ensure_task_files(cfg, data_dir)
    trainer.train_tasks = load_tasks(train_files)
    for i, task in enumerate(trainer.train_tasks):  # each row's identity in the dumps: its row in the task files
        task["task_row"] = i
    trainer.val_tasks = load_tasks(val_files)
    tcfg = cfg.trainer
    validation = {k: getattr(tcfg, k) for k in ("val_freq", "val_before_train", "val_at_end")}
    if any(validation.values()):  # an empty set would log val/* as null at every validation, silently
        settings = " ".join(f"trainer.{k}={v}" for k, v in validation.items())
        require_tasks(trainer.val_tasks, val_files, f"the run validates ({settings}); give validation tasks "
                      f"(data.val_files, or env.val_tasks > 0) or turn validation off (trainer.val_freq=0 "
                      f"trainer.val_before_train=false trainer.val_at_end=false)")
    mix = registry("env").get(cfg.env.name) is MixEnv  # several sources: each step draws them by ratio
    if tcfg.val_max_tasks:  # a mix validates every source: the count spread over them by ratio
        trainer.val_tasks = first_tasks(trainer.val_tasks, tcfg.val_max_tasks,
                                        ratios(cfg.env.kwargs["sources"]) if mix else None)
    trainer.sampler = make_sampler(trainer.train_tasks, cfg.data.train_batch_size, cfg.data.seed, cfg.data.shuffle,
                                   ratios(cfg.env.kwargs["sources"]) if mix else None)

    # Components used on the driver.
    trainer.template = build("template", cfg.template)
    trainer.env_factory = lambda: build("env", cfg.env)
    configured = RewardComposer.from_config(cfg.reward.components, template=trainer.template,
                                            by_source=source_rewards(cfg))
    trainer.composer = RewardComposer([*configured.specs, *trainer.python_rewards])  # callables checked alike
    trainer.allocator = build("allocator", cfg.allocator)
    trainer.algo = algo = cfg.algorithm
    trainer.n = cfg.rollout.n
    estimator = registry("advantage").get(algo.adv_estimator)
    trainer.estimator = estimator() if isinstance(estimator, type) else estimator  # a class: one instance a run
    trainer.use_critic = algo.use_critic
    # Old log-probs of the PPO ratio: auto (recomputed by the actor only when the update is off-policy within
    # a step), true (always recomputed), false (never), rollout (the engine's sampling log-probs).
    trainer.old_log_probs_mode = algo.recompute_old_log_probs
    # Off-policy correction (algorithms/correction.py): tis in the actor's update, which then needs the engine's
    # log-probs; behaviour takes the PPO ratio against them.
    trainer.correction = correction_mode(algo, cfg.rollout, cfg.agent)
    filtering = algo.filter_groups.enabled
    trainer.group_filter = GroupFilter(trainer.composer, algo.filter_groups.metric) if filtering else None
    extra = algo.filter_groups.max_extra_groups
    trainer.max_extra_groups = cfg.data.train_batch_size if extra is None else extra
    trainer.kl_ctrl = make_kl_controller(**dataclasses.asdict(algo.kl_ctrl))

    # The model every worker loads: a local HF folder, or the embedded tiny model built now.
    trainer.model_dir, trainer.tokenizer = prepare_model_dir(cfg, trainer.run_dir, trainer.train_tasks,
                                                             trainer.env_factory, trainer.template, trainer.log,
                                                             resuming=trainer.resume_path is not None)
    trainer.pad_token_id = trainer.tokenizer.pad_token_id
    if algo.teacher.path:  # its log-probs score the policy's tokens: both must read the same ids as the same text
        from openmanus_rl_core.models.loading import load_tokenizer

        if load_tokenizer(algo.teacher.path, cfg.model.chat_template).get_vocab() != trainer.tokenizer.get_vocab():
            raise ConfigError(f"algorithm.teacher.path={algo.teacher.path}: its tokenizer is not the policy's "
                              f"({trainer.model_dir}); distillation needs the same vocabulary")
    if cfg.trainer.save_rollouts:
        trainer.dumps = RolloutDumps(trainer.run_dir, trainer.model_dir)
    start_workers(trainer)
    heap.freeze()  # Trainer.shutdown gives the objects back


def start_workers(trainer: Any) -> None:
    """The actor (and critic) worker groups, from ``trainer.worker_classes()``; also after a worker failure."""
    from openmanus_rl_core.distributed.sizing import ensure_ray, start_worker_groups

    with trainer.stop.deferred():  # Ray's imports and start-up are not cut in the middle
        trainer.ray_started = ensure_ray(trainer.cfg.trainer) or trainer.ray_started
        t0 = time.perf_counter()
        actor_cls, critic_cls = trainer.worker_classes()
        trainer.actor, trainer.critic = start_worker_groups(trainer.cfg, actor_cls,
                                                            critic_cls if trainer.use_critic else None,
                                                            trainer.model_dir, trainer.total_steps)
    W, info = trainer.actor.size, trainer.actor.setup_info[0]
    trainer.log(f"{W} actor worker(s){' + ' + str(W) + ' critic worker(s)' if trainer.critic else ''} ready on "
                f"{info['device']} in {time.perf_counter() - t0:.1f}s; policy parameters: {info['params']:,}; "
                f"sharding: {info.get('sharding', 'full')}")
