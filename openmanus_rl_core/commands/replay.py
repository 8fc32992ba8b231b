"""``openmanus-rl replay``: a run's updates again, from its rollout dumps, with no rollout and no env.

``openmanus-rl replay trainer.checkpoint=<run>/checkpoints/step_000000 replay.steps=1..5`` starts the run's worker
groups (its config, its model folder, as many ranks) from that checkpoint, then feeds each step's dumped batch
(``trainer.save_rollouts``, :mod:`openmanus_rl_core.run.dumps`) to the critic's and the actor's update exactly as the
trainer did. Nothing is generated and no env is built: a trainer bug reproduces in seconds, under a debugger if you
like. Where the run has its own checkpoint of the last step, the replayed weights are compared with it:
``max abs diff to the run's step M: <x>`` (0 when the update is deterministic, as on CPU).

Everything is checked before a worker starts: the range against the dumps and the checkpoint, every dump file
(readable, whole, of this run's model and tokenizer).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import check


def replay(cfg: Any, overrides: Sequence[str] = ()) -> int:
    """The command (module docstring); returns the exit status."""
    from openmanus_rl_core.checkpoint.store import checkpoints_dir, load_checkpoint, open_checkpoint, step_dir_name
    from openmanus_rl_core.commands.from_run import run_model_dir
    from openmanus_rl_core.run.dumps import FOLDER, dump_path, model_fingerprint, read_dump

    c = check(cfg, training=False)
    if not c.trainer.checkpoint:
        raise ConfigError("replay needs trainer.checkpoint=<the checkpoint the replay starts from>")
    path, state = open_checkpoint(str(c.trainer.checkpoint))
    run = _run_config(state["meta"]["config"])
    start = int(state["trainer"]["step"])
    folder = Path(c.replay.rollouts) if c.replay.rollouts else path.parent.parent / FOLDER
    first, last = _steps(c.replay.steps, start, folder)
    model_dir = run_model_dir(path, state["meta"].get("model_dir"))
    fingerprint = model_fingerprint(model_dir)
    batches = {k: read_dump(dump_path(folder, k), fingerprint) for k in range(first, last + 1)}  # all, up front
    print(f"replaying steps {first}..{last} from {path} (step {start}) with the dumps in {folder}")

    actor, critic, started = _workers(run, model_dir, path, state)
    try:
        for step, batch in batches.items():
            t0 = time.perf_counter()
            metrics = _update(run, actor, critic, batch, step)
            shown = " ".join(f"{k} {v:.6g}" for k, v in sorted(metrics.items()) if k.endswith(("loss", "grad_norm")))
            print(f"step {step}: {len(batch)} samples, {shown} ({time.perf_counter() - t0:.2f}s)")
        own = checkpoints_dir(path.parent.parent) / step_dir_name(last)
        if own.is_dir():
            saved = load_checkpoint(own, keys=["model", "critic"] if critic is not None else ["model"])
            diff = _max_abs_diff(actor.call("get_state")[0]["model"], saved["model"])
            if critic is not None:
                diff = max(diff, _max_abs_diff(critic.call("get_state")[0]["model"], saved["critic"]["model"]))
            print(f"max abs diff to the run's step {last}: {diff:.3g}")
        else:
            print(f"the run has no checkpoint of step {last} to compare with ({own})")
    finally:
        for group in (actor, critic):
            if group is not None:
                group.kill()
        if started:
            import ray

            ray.shutdown()
    return 0


def _run_config(saved: dict) -> Any:
    """The run's own config, as its checkpoint recorded it."""
    from omegaconf import OmegaConf

    from openmanus_rl_core.config.schema import Config

    known = {f for f in Config.__dataclass_fields__}
    node = OmegaConf.merge(OmegaConf.structured(Config), {k: v for k, v in saved.items() if k in known})
    return check(OmegaConf.to_object(node), training=False)


def _steps(given: str | None, start: int, folder: Path) -> tuple[int, int]:
    """``(first, last)`` of ``replay.steps``: it must start right after the checkpoint and be held by the dumps."""
    from openmanus_rl_core.run.dumps import dumped_steps

    held = dumped_steps(folder)
    if not held:
        raise ConfigError(f"replay.rollouts={folder}: no rollout dumps there (a run writes them with "
                          f"trainer.save_rollouts=true)")
    if given is None:
        last = start
        while last + 1 in held:
            last += 1
        first = start + 1
    else:
        text = str(given).strip()
        try:
            first_text, _, last_text = text.partition("..")
            first, last = int(first_text), int(last_text or first_text)
        except ValueError:
            raise ConfigError(f"replay.steps={text}: must be K..M (e.g. {start + 1}..{start + 5})") from None
    what = f"replay.steps={given if given is not None else f'{first}..{last}'}"
    if first != start + 1:
        raise ConfigError(f"{what}: the checkpoint holds step {start}, so a replay from it starts at step {start + 1}")
    missing = [k for k in range(first, last + 1) if k not in held]
    if last < first or missing:
        ranges = _ranges(held)
        raise ConfigError(f"{what}: the dumps in {folder} hold steps {ranges}" +
                          (f"; step {missing[0]} is missing" if missing else ""))
    return first, last


def _ranges(steps: list[int]) -> str:
    out, begin = [], None
    for i, k in enumerate(steps):
        begin = k if begin is None else begin
        if i + 1 == len(steps) or steps[i + 1] != k + 1:
            out.append(f"{begin}..{k}" if k != begin else str(k))
            begin = None
    return ", ".join(out)


def _workers(run: Any, model_dir: str, path: Path, state: dict) -> tuple[Any, Any, bool]:
    """The run's actor (and critic) groups, with the checkpoint's state; and whether this started Ray."""
    from openmanus_rl_core.distributed.sizing import ensure_ray, start_worker_groups
    from openmanus_rl_core.run.state import load_workers
    from openmanus_rl_core.workers import ActorWorker, CriticWorker

    started = ensure_ray(run.trainer)
    critic_cls = CriticWorker if run.algorithm.use_critic else None
    actor, critic = start_worker_groups(run, ActorWorker, critic_cls, model_dir, run.trainer.total_steps)
    load_workers(actor, critic, path, state)
    return actor, critic, started


def _update(run: Any, actor: Any, critic: Any, batch: Any, step: int) -> dict[str, float]:
    """One step's critic and actor updates on ``batch``, as the trainer's phases make them."""
    from openmanus_rl_core.algorithms.correction import correction_mode
    from openmanus_rl_core.distributed.sharding import shard_batch
    from openmanus_rl_core.run.trainer import _avg
    from openmanus_rl_core.run.worker_inputs import actor_batch, critic_batch

    metrics: dict[str, float] = {}
    if critic is not None:
        shards, _ = shard_batch(critic_batch(batch), critic.size)
        metrics.update(_avg(critic.call_each("update", [(s, step) for s in shards])))
    if step > run.critic.warmup_steps:
        view = actor_batch(batch, correction_mode(run.algorithm, run.rollout, run.agent))
        shards, _ = shard_batch(view, actor.size)
        metrics.update(_avg(actor.call_each("update", [(s, step) for s in shards])))
    return metrics


def _max_abs_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts' tensors (inf when their keys or shapes differ)."""
    if a.keys() != b.keys():
        return float("inf")
    worst = 0.0
    for k, x in a.items():
        y = b[k]
        if x.shape != y.shape:
            return float("inf")
        worst = max(worst, float((x.float() - y.float()).abs().max()) if x.numel() else 0.0)
    return worst
