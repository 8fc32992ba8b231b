"""Episodes as records for people to read: one JSON object per episode (task, group, termination, reward and its
breakdown, the turns with response, parsed action, observation, env reward, info and token span), written as JSON
lines and as one self-contained HTML page (no scripts, no external files). ``openmanus-rl rollout`` writes them for
its episodes, validation for a sample of its own."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["jsonable", "episode_record", "write_jsonl", "write_html", "write_validation"]


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return jsonable(value.tolist())  # numpy / torch values
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
        "task_row": (t.task or {}).get("task_row"),  # the task row's index in the run's task files (training)
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
    return jsonable(rec)


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
