"""Ray and the worker groups of a run: Ray started (or joined), each worker's share of the cluster's CPUs and GPUs,
then the actor group (and the critic group when the algorithm has one)."""

from __future__ import annotations

import os

from openmanus_rl_core.distributed.worker_group import WorkerGroup
from openmanus_rl_core.config.schema import Config, TrainerConfig


def ensure_ray(tcfg: TrainerConfig) -> bool:
    """Start a private Ray (or join ``trainer.ray_address``) unless this process already has one; True when it
    started one (the run then shuts it down)."""
    import ray

    from openmanus_rl_core.distributed.ray_node import start_ray

    if ray.is_initialized():
        return False
    start_ray(tcfg.ray_address, tcfg.num_cpus or os.cpu_count() or 1, log_to_driver=tcfg.log_to_driver,
              configure_logging=True, logging_level="warning")
    return True


def worker_share(tcfg: TrainerConfig, groups: int) -> tuple[float, float]:
    """``(CPUs, GPUs)`` of one worker: ``trainer.worker_num_cpus`` / ``worker_num_gpus``, or, unset, an equal share
    of the cluster among the ``num_workers * groups`` workers (at most one CPU; a GPU split between the groups)."""
    import ray

    W = tcfg.num_workers
    resources = ray.cluster_resources()
    cpus = tcfg.worker_num_cpus
    if cpus is None:  # logical CPUs only schedule actors
        cpus = min(1.0, float(resources.get("CPU", 1.0)) / (W * groups))
    have_gpus = float(resources.get("GPU", 0.0))
    gpus = tcfg.worker_num_gpus
    if gpus is None:
        gpus = (1.0 / groups) if have_gpus > 0 and tcfg.device != "cpu" else 0.0
    if gpus and W * groups * float(gpus) > have_gpus + 1e-9:
        raise RuntimeError(
            f"trainer.num_workers={W} ({groups} group(s), {gpus} GPU each) needs {W * groups * float(gpus):g} GPUs "
            f"but the Ray cluster has {have_gpus:g}; set trainer.num_workers to at most the GPU count "
            f"(NCCL cannot put two ranks of one group on one GPU) or trainer.device=cpu")
    return float(cpus), float(gpus)


def start_worker_groups(cfg: Config, actor_cls: type, critic_cls: type | None, model_dir: str,
                        total_steps: int) -> tuple[WorkerGroup, WorkerGroup | None]:
    """The actor group and, when ``critic_cls`` is given, the critic group, each of ``trainer.num_workers`` ranks."""
    tcfg = cfg.trainer
    cpus, gpus = worker_share(tcfg, 2 if critic_cls is not None else 1)

    def group(cls: type, name: str) -> WorkerGroup:
        return WorkerGroup(cls, tcfg.num_workers, cfg, num_cpus=cpus, num_gpus=gpus, name=name,
                           placement_strategy=tcfg.placement_strategy, model_dir=model_dir, total_steps=total_steps)

    actor = group(actor_cls, "actor")
    try:
        return actor, (group(critic_cls, "critic") if critic_cls is not None else None)
    except BaseException:
        actor.kill()
        raise
