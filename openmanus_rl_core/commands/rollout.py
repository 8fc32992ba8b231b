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

import html
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from openmanus_rl_core.schema import Config

__all__ = ["rollout", "load_task_rows", "episode_record", "write_jsonl", "write_html", "write_validation"]




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
                from openmanus_rl_core.data import load_tasks

                rows.extend(load_tasks(str(p)))
        if cfg.rollout.tasks_file is None:  # data.val_files: its first rollout.num_tasks rows
            rows = rows[: cfg.rollout.num_tasks]
        return rows
    offset = cfg.rollout.task_offset
    return [{"task_id": offset + i, "seed": cfg.seed + offset + i} for i in range(cfg.rollout.num_tasks)]


# ---------------------------------------------------------------------------------------------- records
def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return _jsonable(value.tolist())  # numpy / torch values
    except AttributeError:
        return repr(value)


def episode_record(episode: Any, breakdown: Any | None = None, index: int = 0, tokenizer: Any = None) -> dict[str, Any]:
    """A JSON-ready dict for one episode (what a line of ``trajectories.jsonl`` holds). With ``tokenizer``, each
    turn also carries ``context``: the exact tokens the model saw before that reply, decoded (special tokens kept),
    and ``context_tokens``, their number."""
    t = episode.trajectory
    turns = []
    for k, tr in enumerate(t.turns):
        turns.append({
            "turn": k,
            "response": tr.response,
            "action": {"kind": tr.action.kind, "content": tr.action.content, "valid": tr.action.valid,
                       "thought": tr.action.thought},
            "observation": tr.observation,
            "env_reward": tr.reward,
            "reward": (breakdown.turn_rewards[k] if breakdown is not None and k < len(breakdown.turn_rewards)
                       else None),
            "done": tr.done,
            "info": tr.info,
            "span": list(tr.span),
        })
        if tokenizer is not None:
            ids = episode.context_ids(k)
            turns[-1]["context"] = tokenizer.decode(ids, skip_special_tokens=False)
            turns[-1]["context_tokens"] = len(ids)
    rec = {
        "index": index,
        "task_id": t.task_id,
        "seed": t.seed,
        "group_id": t.group_id,
        "uid": episode.uid,
        "success": t.success,
        "termination": t.termination,
        "error": t.error,
        "num_turns": t.num_turns,
        "env_reward": t.env_reward,
        "reward": breakdown.total if breakdown is not None else t.env_reward,
        "reward_parts": dict(breakdown.parts) if breakdown is not None else {},
        "reward_errors": dict(getattr(breakdown, "errors", {}) or {}) if breakdown is not None else {},
        "truncated": episode.truncated,
        "prompt_tokens": len(episode.prompt_ids),
        "response_tokens": len(episode.response_ids),
        "agent_tokens": int(sum(episode.response_mask)),
        "initial_observation": t.initial_observation,
        "turns": turns,
        "task": t.task,
        "info": t.info,
    }
    return _jsonable(rec)


def write_validation(run_dir: str | Path, step: int, prefix: str, episodes: Sequence[Any], breakdowns: Sequence[Any],
                     tokenizer: Any = None, metrics: Mapping[str, Any] | None = None) -> Path:
    """One validation's episodes (prompt and context, replies, observations, reward per component) as
    ``<run_dir>/validation/<prefix>_step_<N>.jsonl``, and the same page ``rollout`` writes next to it (``.html``);
    the JSONL path."""
    folder = Path(run_dir) / "validation"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix.replace('/', '_')}_step_{int(step):06d}"
    records = [episode_record(e, breakdowns[i], i, tokenizer) for i, e in enumerate(episodes)]
    summary = {"step": int(step), "episodes": len(records),
               **{k.split("/", 1)[1]: v for k, v in (metrics or {}).items() if k.startswith(prefix + "/")
                  and "/" not in k[len(prefix) + 1:]}}
    write_html(folder / f"{stem}.html", records, summary, title=f"validation at step {step}")
    return write_jsonl(folder / f"{stem}.jsonl", records)


def write_jsonl(path: str | Path, records: Sequence[Mapping[str, Any]]) -> Path:
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
details{border:1px solid #ddd;border-radius:6px;margin:.4em 0;padding:.3em .6em}
summary{cursor:pointer}.ok{color:#070}.bad{color:#a00}.muted{color:#777}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.4em;margin:.2em 0;border-radius:4px}
.turn{border-left:3px solid #89b;padding-left:.6em;margin:.6em 0}.obs{background:#eef5ee}.resp{background:#f3f0fa}
.ctx{background:#fdf8e8;font-size:90%}
"""


def _e(value: Any) -> str:
    """Escape anything for HTML text and attribute context."""
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, float) else _e(x)


def write_html(path: str | Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None = None,
               title: str = "openmanus-rl rollout") -> Path:
    """One self-contained HTML page (inline CSS, no scripts): a summary table, then one collapsible block per
    episode with its turns (reply, parsed action, observation, rewards) and reward breakdown. All text escaped."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>"]
    if summary:
        parts.append("<table>")
        for k, v in summary.items():
            parts.append(f"<tr><th>{_e(k)}</th><td>{_fmt(v)}</td></tr>")
        parts.append("</table>")
    parts.append("<table><tr><th>#</th><th>task</th><th>group</th><th>success</th><th>termination</th>"
                 "<th>turns</th><th>reward</th></tr>")
    for r in records:
        cls = "ok" if r.get("success") else "bad"
        parts.append(
            f"<tr><td><a href='#ep{_e(r.get('index'))}'>{_e(r.get('index'))}</a></td><td>{_e(r.get('task_id'))}</td>"
            f"<td class='muted'>{_e(str(r.get('group_id'))[:8])}</td><td class='{cls}'>{_e(r.get('success', '-') if r.get('success') is not None else '-')}</td>"
            f"<td>{_e(r.get('termination'))}</td><td>{_e(r.get('num_turns'))}</td><td>{_fmt(r.get('reward'))}</td></tr>")
    parts.append("</table>")
    for r in records:
        cls = "ok" if r.get("success") else "bad"
        parts.append(
            f"<details id='ep{_e(r.get('index'))}'><summary>episode {_e(r.get('index'))} &middot; task "
            f"{_e(r.get('task_id'))} &middot; <span class='{cls}'>{_e(r.get('termination'))}</span> &middot; "
            f"{_e(r.get('num_turns'))} turns &middot; reward {_fmt(r.get('reward'))}</summary>")
        if r.get("error"):
            parts.append(f"<p class='bad'>error: {_e(r.get('error'))}</p>")
        breakdown = r.get("reward_parts") or {}
        if breakdown:
            parts.append("<table><tr><th>reward component</th><th>weighted value</th></tr>")
            for k, v in breakdown.items():
                parts.append(f"<tr><td>{_e(k)}</td><td>{_fmt(v)}</td></tr>")
            parts.append(f"<tr><th>total</th><th>{_fmt(r.get('reward'))}</th></tr></table>")
        for k, v in (r.get("reward_errors") or {}).items():
            parts.append(f"<p class='bad'>reward {_e(k)} failed: {_e(v)}</p>")
        parts.append(f"<p class='muted'>tokens: prompt {_e(r.get('prompt_tokens'))}, response "
                     f"{_e(r.get('response_tokens'))} (agent {_e(r.get('agent_tokens'))}); truncated "
                     f"{_e(r.get('truncated'))}</p>")
        parts.append(f"<div>first observation:<pre class='obs'>{_e(r.get('initial_observation'))}</pre></div>")
        for t in r.get("turns", []):
            a = t.get("action", {})
            valid = "ok" if a.get("valid") else "bad"
            context = (f"<details><summary class='muted'>context the model saw ({_e(t.get('context_tokens'))} tokens)"
                       f"</summary><pre class='ctx'>{_e(t['context'])}</pre></details>" if "context" in t else "")
            parts.append(
                f"<div class='turn'><b>turn {_e(t.get('turn'))}</b> <span class='muted'>tokens {_e(t.get('span'))}"
                f"</span>{context}<pre class='resp'>{_e(t.get('response'))}</pre>"
                f"action <span class='{valid}'>[{_e(a.get('kind'))}]</span> <code>{_e(a.get('content'))}</code>"
                f"<pre class='obs'>{_e(t.get('observation'))}</pre>"
                f"env reward {_fmt(t.get('env_reward'))} &middot; turn reward {_fmt(t.get('reward'))}"
                f" &middot; done {_e(t.get('done'))}"
                + (f" &middot; <span class='muted'>info {_e(json.dumps(t.get('info'), ensure_ascii=False))}</span>"
                   if t.get("info") else "")
                + "</div>")
        parts.append("</details>")
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("".join(parts), encoding="utf-8")
    return path


# -------------------------------------------------------------------------------------------------- job
def rollout(cfg: Any, overrides: Sequence[str] = ()) -> int:
    """Run ``openmanus-rl rollout`` with the composed config; returns the exit status (0; 1 when every episode
    ended as ``env_error``). ``overrides``: the command line, whose sections win over a checkpoint's run."""
    from openmanus_rl_core.commands.from_run import adopt_run_config
    from openmanus_rl_core.config import ConfigError, check
    from openmanus_rl_core.engines import preflight
    from openmanus_rl_core.envs import open_env_service
    from openmanus_rl_core.metrics import dated_dir
    from openmanus_rl_core.registry import registry

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
    # A served model's server, then the env's servers, are checked (or started) before the model is built.
    preflight(cfg.rollout.engine, cfg.rollout.engine_kwargs)
    service = open_env_service(cfg.env.name, registry("env").get(cfg.env.name), cfg.env.kwargs)
    cfg.env.kwargs = service.kwargs
    try:
        return _run(cfg, ckpt, out_dir)
    finally:
        service.close()


def _run(cfg: Any, ckpt: Any, out_dir: Path) -> int:
    import torch
    from tqdm.auto import tqdm

    from openmanus_rl_core.commands.from_run import load_policy
    from openmanus_rl_core.models import load_model_and_tokenizer
    from openmanus_rl_core.registry import build, registry
    from openmanus_rl_core.rewards import RewardComposer
    from openmanus_rl_core.rollout import AgentLoop, build_batch, expand_tasks, rollout_metrics, tokenizer_corpus

    rcfg = cfg.rollout
    torch.manual_seed(cfg.seed)
    env_factory = lambda: build("env", cfg.env)  # noqa: E731
    template = build("template", cfg.template)
    composer = RewardComposer.from_config(cfg.reward.components, template=template) if cfg.reward.components else None
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
    per_run = max(rcfg.n, rcfg.batch_size - rcfg.batch_size % rcfg.n)  # keep the samples of one task in one run
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
    (out_dir / "metrics.json").write_text(json.dumps(_jsonable(metrics), indent=2), encoding="utf-8")

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
