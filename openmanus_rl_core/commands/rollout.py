"""``openmanus-rl rollout``: collect trajectories for a set of tasks and write them for reading.

    openmanus-rl rollout trainer.checkpoint=outputs/2026-11-23/10-00-00-key_door rollout.num_tasks=32 rollout.n=4
    openmanus-rl rollout env=key_door template=react model.path=/path/to/hf_folder rollout.temperature=0.7

The policy: a checkpoint's weights (``trainer.checkpoint``: a step folder or a run directory), whose run also
gives the env, template, reward, allocator and model unless the command line names them (printed at start); or a
Hugging Face folder (``model.path``); or, with neither, the embedded tiny model untrained. Everything concrete
comes from the registries, chosen by the config: the env (``env.name`` + ``env.kwargs``), the template, the reward
components (``reward.components``), the allocator and the engine (``rollout.engine`` + ``rollout.engine_kwargs``).

Tasks: the rows of ``rollout.tasks_file`` (parquet, or JSON lines), else ``data.val_files`` when set, else
``rollout.num_tasks`` task ids from ``rollout.task_offset`` (seed = ``seed`` + task id). Each task is run
``rollout.n`` times (default ``algorithm.n``: 8 with GRPO; ``rollout.n=1`` for one episode per task),
``rollout.batch_size`` episodes per agent-loop run, with a progress bar.

Writes into ``rollout.output_dir`` (default ``<trainer.output_dir>/<date>/<time>-rollout-<env>``, created and
checked before any work):

- ``trajectories.jsonl``: one JSON object per episode (task, group, termination, reward and its breakdown, the
  turns with response, parsed action, observation, env reward, info, token span);
- ``trajectories.html``: a single self-contained page (no scripts, no external files) to browse them;
- ``metrics.json``: the rollout and reward metrics.

Prints success rate, mean reward, mean turns and throughput.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openmanus_rl_core.config.schema import Config
from openmanus_rl_core.rollout.records import episode_record, jsonable, write_html, write_jsonl

__all__ = ["rollout", "load_task_rows"]




# ------------------------------------------------------------------------------------------------- tasks
def load_task_rows(cfg: Config) -> list[dict[str, Any]]:
    """The tasks this rollout runs (see the module docstring for the order of sources)."""
    path = cfg.rollout.tasks_file or cfg.data.val_files
    if path:
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        rows: list[dict[str, Any]] = []
        for p in paths:
            p = Path(str(p)).expanduser()
            if not p.exists():
                raise FileNotFoundError(f"task file {str(p)!r} does not exist; fix rollout.tasks_file / data.val_files")
            if p.suffix in (".jsonl", ".json"):
                with open(p, encoding="utf-8") as f:
                    rows.extend(json.loads(line) for line in f if line.strip())
            else:
                from openmanus_rl_core.data.tasks import load_tasks

                rows.extend(load_tasks(str(p)))
        if cfg.rollout.tasks_file is None:  # data.val_files: its first rollout.num_tasks rows
            rows = rows[: cfg.rollout.num_tasks]
        return rows
    offset = cfg.rollout.task_offset
    return [{"task_id": offset + i, "seed": cfg.seed + offset + i} for i in range(cfg.rollout.num_tasks)]


def episodes_per_run(rcfg: Any) -> int:
    """Episodes per agent-loop run (played at once): ``rollout.batch_size``, whole tasks (``rollout.n`` each)."""
    return max(rcfg.n, rcfg.batch_size - rcfg.batch_size % rcfg.n)  # keep the samples of one task in one run


def rollout(cfg: Any, overrides: Sequence[str] = ()) -> int:
    """Run ``openmanus-rl rollout`` with the composed config; returns the exit status (0; 1 when every episode
    ended as ``env_error``). ``overrides``: the command line, whose sections win over a checkpoint's run."""
    from openmanus_rl_core.commands.from_run import adopt_run_config
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.loading import check
    from openmanus_rl_core.plugin.envs import open_env_service
    from openmanus_rl_core.run.metrics import dated_dir
    from openmanus_rl_core.plugin.registry import registry

    cfg, ckpt = adopt_run_config(check(cfg, training=False), overrides)
    # The output folder first: a path that cannot be written fails now, not after every episode has run.
    key, where = ("rollout.output_dir", cfg.rollout.output_dir) if cfg.rollout.output_dir else (
        "trainer.output_dir", cfg.trainer.output_dir)
    try:
        if cfg.rollout.output_dir:
            out_dir = Path(cfg.rollout.output_dir).expanduser()
            out_dir.mkdir(parents=True, exist_ok=True)
        else:
            out_dir = dated_dir(cfg.trainer.output_dir, f"rollout-{cfg.env.name}")
        if not os.access(out_dir, os.W_OK):
            raise PermissionError("not writable")
    except OSError as exc:
        raise ConfigError(f"{key}={where}: cannot write the rollout there ({exc.strerror or exc})") from None
    # The env's servers are checked (or started) before the model is built (a served model's: cli.prepare).
    at_once = min(len(load_task_rows(cfg)) * cfg.rollout.n, episodes_per_run(cfg.rollout))
    service = open_env_service(cfg.env.name, registry("env").get(cfg.env.name), cfg.env.kwargs, at_once=at_once)
    cfg.env.kwargs = service.kwargs
    try:
        return _run(cfg, ckpt, out_dir)
    finally:
        service.close()


def _run(cfg: Any, ckpt: Any, out_dir: Path) -> int:
    import torch
    from tqdm.auto import tqdm

    from openmanus_rl_core.commands.from_run import load_policy
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.plugin.mix import source_rewards
    from openmanus_rl_core.plugin.registry import build, registry
    from openmanus_rl_core.rewards.composer import RewardComposer
    from openmanus_rl_core.rollout import AgentLoop, build_batch, expand_tasks, rollout_metrics, tokenizer_corpus

    rcfg = cfg.rollout
    torch.manual_seed(cfg.seed)
    env_factory = lambda: build("env", cfg.env)  # noqa: E731
    template = build("template", cfg.template)
    by_source = source_rewards(cfg)
    composer = (RewardComposer.from_config(cfg.reward.components, template=template, by_source=by_source)
                if cfg.reward.components or by_source else None)
    allocator = build("allocator", cfg.allocator)

    tasks = load_task_rows(cfg)
    if not tasks:
        raise ValueError("no tasks to run: set rollout.num_tasks > 0 or point rollout.tasks_file at a task file")
    # An engine with needs_model=False (a served model) gets the run's tokenizer only, never weights.
    needs_model = getattr(registry("engine").get(rcfg.engine), "needs_model", True)
    policy = load_policy(cfg, ckpt, tokenizer_only=not needs_model)
    if policy is None:
        # The embedded tiny model, untrained: its tokenizer learns from what the agent will read and write.
        corpus = tokenizer_corpus(env_factory, template, tasks[: min(len(tasks), 64)], max_turns=rcfg.max_turns)
        (model, tokenizer), weights = load_model_and_tokenizer(cfg.model, corpus=corpus), None
        print("policy: the embedded tiny model, untrained (give trainer.checkpoint=<run> or model.path=<folder>)"
              if needs_model else f"tokenizer: the embedded tiny model's; replies from rollout.engine={rcfg.engine}")
    else:
        model, tokenizer, weights = policy
    engine_kwargs = {"device": rcfg.device, "seed": cfg.seed, **rcfg.engine_kwargs}
    runtime = {"model": model, "tokenizer": tokenizer} if needs_model else {"tokenizer": tokenizer}
    engine = build("engine", {"name": rcfg.engine, "kwargs": engine_kwargs}, **runtime)
    if weights is not None and needs_model:
        engine.update_weights(weights)
    loop = AgentLoop(engine, tokenizer, template, env_factory, rcfg, memory=build("memory", cfg.memory))

    expanded = expand_tasks(tasks, rcfg.n)
    per_run = episodes_per_run(rcfg)
    episodes = []
    t0 = time.perf_counter()
    with tqdm(total=len(expanded), desc="rollout", unit="episode", file=sys.stderr, dynamic_ncols=True) as bar:
        for i in range(0, len(expanded), per_run):
            done = loop.run(expanded[i: i + per_run])
            episodes.extend(done)
            bar.update(len(done))
            bar.set_postfix(success=f"{sum(bool(e.trajectory.success) for e in episodes) / len(episodes):.3f}")
    elapsed = time.perf_counter() - t0

    if composer is not None:
        breakdowns, reward_metrics = composer.compose_batch([e.trajectory for e in episodes])
    else:
        breakdowns, reward_metrics = None, {}
    # The training batch as the trainer would build it: a broken allocator fails here, not in training.
    build_batch(episodes, breakdowns, allocator, tokenizer.pad_token_id, keep_env_errors=rcfg.keep_env_errors)
    metrics = rollout_metrics(episodes, elapsed_s=elapsed)
    metrics.update(reward_metrics)
    # Per episode, not per sample (a per-turn memory makes one row per turn).
    rewards = [float(b.total) for b in breakdowns] if breakdowns is not None else [e.trajectory.env_reward
                                                                                    for e in episodes]
    metrics["rollout/reward/mean"] = sum(rewards) / len(rewards)

    records = [episode_record(e, breakdowns[i] if breakdowns is not None else None, i, tokenizer)
               for i, e in enumerate(episodes)]
    write_jsonl(out_dir / "trajectories.jsonl", records)
    summary = {
        "env": cfg.env.name, "template": cfg.template.name, "episodes": len(episodes),
        "success rate": metrics["rollout/success_rate"], "mean reward": metrics["rollout/reward/mean"],
        "mean turns": metrics["rollout/turns/mean"], "turns/s": metrics.get("rollout/turns_per_s", 0.0),
        "episodes/s": metrics.get("rollout/episodes_per_s", 0.0),
        **{k.split("/", 1)[1]: int(v) for k, v in metrics.items() if k.startswith("rollout/termination/") and v},
    }
    write_html(out_dir / "trajectories.html", records, summary, title=f"openmanus-rl rollout: {cfg.env.name}")
    (out_dir / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=2), encoding="utf-8")

    print(f"episodes: {len(episodes)} ({len(tasks)} tasks x n={rcfg.n}) in {elapsed:.2f}s")
    print(f"success rate: {metrics['rollout/success_rate']:.3f}")
    print(f"mean reward: {metrics['rollout/reward/mean']:.4f}")
    print(f"mean turns: {metrics['rollout/turns/mean']:.2f}")
    print(f"throughput: {metrics.get('rollout/turns_per_s', 0.0):.1f} turns/s, "
          f"{metrics.get('rollout/episodes_per_s', 0.0):.2f} episodes/s, "
          f"{metrics.get('rollout/tokens_per_s', 0.0):.0f} generated tokens/s")
    terms = ", ".join(f"{k.rsplit('/', 1)[1]}={int(v)}" for k, v in metrics.items()
                      if k.startswith("rollout/termination/") and v)
    print(f"terminations: {terms}")
    print(f"wrote {out_dir / 'trajectories.jsonl'} and {out_dir / 'trajectories.html'}")
    failed = [e.trajectory for e in episodes if e.trajectory.termination == "env_error"]
    if len(failed) == len(episodes):
        print(f"error: every episode ended as env_error; the first error: {failed[0].error}", file=sys.stderr)
        return 1
    return 0
