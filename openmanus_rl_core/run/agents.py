"""Agents on record: how each step's agents went (``agent.command`` / ``agent.function``), kept in the run folder.

``<run_dir>/agents/step_000012.jsonl`` holds step 12's training episodes, ``val_step_000012.jsonl`` its validation's
(``warmup_val_step_000000.jsonl``: the validation right after the warm-up), one JSON object per episode::

    {"task_id": 3, "seed": 11, "group_id": "12:1", "sample_index": 0, "validation": false, "exit": 1,
     "error": "exited 1: ...", "seconds": 0.84, "calls": 2, "reward": null, "stderr": "...", "stdout": "...",
     "termination": "env_error"}

- the task: ``task_id``, ``seed``, ``group_id``, ``sample_index`` (within its group), and the row's identity where
  it has one (:data:`TASK_KEYS`);
- the agent (gateway/rollout.py ``agent_outcome``): ``exit`` (a command's status; 128 + N: ended by signal N, as a
  shell says; null for a function), ``error`` (null: the episode trained; else the agent's own error, or why its
  episode could not train, e.g. it made no call), ``seconds``, ``calls`` made to the gateway, ``reward`` (posted or
  returned; null: none), the last lines of its ``stderr`` and ``stdout`` (a command's);
- ``termination``: how the episode ended (``env_error``: it left the loss).

A run without an agent writes nothing here. Each file is written to a temporary name and renamed (a step run again
after a resume replaces it). ``openmanus-rl inspect`` reads them (:func:`read_records`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from openmanus_rl_core.atomic import write_atomic

FOLDER = "agents"
# What names a task row and its sample (the row's own identity where it has one: a task file's item_id, a mix's source)
TASK_KEYS = ("task_id", "seed", "group_id", "sample_index", "item_id", "data_source", "source")
_FILE = re.compile(r"^(?:(?P<prefix>[a-z_]+)_)?step_(?P<step>\d+)\.jsonl$")


def records_path(run_dir: str | os.PathLike, step: int, prefix: str = "") -> Path:
    """The file of step ``step``'s episodes; ``prefix``: a validation's metric prefix (``val``, ``warmup/val``)."""
    head = f"{prefix.replace('/', '_')}_" if prefix else ""
    return Path(run_dir) / FOLDER / f"{head}step_{int(step):06d}.jsonl"


def agent_records(episodes: Sequence[Any], validation: bool = False) -> list[dict[str, Any]]:
    """One record per episode played by an agent (module doc); episodes of the built-in loop have none."""
    out = []
    for episode in episodes:
        t = episode.trajectory
        agent = t.info.get("agent")
        if agent is None:
            continue
        task = {k: t.task[k] for k in TASK_KEYS if k in (t.task or {})}
        task.setdefault("task_id", t.task_id)
        error = agent["error"] if agent["error"] is not None else t.error
        out.append({**task, "validation": validation, **agent, "error": error, "termination": t.termination})
    return out


def write_records(run_dir: str | os.PathLike, step: int, records: Sequence[dict], prefix: str = "") -> Path | None:
    """``records`` as step ``step``'s file (atomically); None and no file when there are none."""
    if not records:
        return None
    path = records_path(run_dir, step, prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def no_call_line(episodes: Sequence[Any], where: str) -> str | None:
    """One line for the agents that ended normally and posted a reward but made no call to the gateway (their
    episodes hold nothing the policy produced, so they are env_error), or None when there are none. ``where``:
    ``step 3``, ``val at step 3``."""
    agents = [(e.trajectory, e.trajectory.info["agent"]) for e in episodes if "agent" in e.trajectory.info]
    silent = [t for t, a in agents if a["error"] is None and a["calls"] == 0 and a["reward"] is not None]
    if not silent:
        return None
    tasks = ", ".join(str(t.task_id) for t in silent[:5]) + (", ..." if len(silent) > 5 else "")
    return (f"{where}: {len(silent)} of {len(agents)} agents posted a reward but made no call to the gateway (tasks "
            f"{tasks}): their episodes are env_error and leave the loss; an agent must ask the policy at "
            f"$OPENAI_BASE_URL with its $OPENAI_API_KEY")


def record_agents(run_dir: str | os.PathLike, step: int, episodes: Sequence[Any], log: Callable[[str], None],
                  prefix: str = "") -> list[dict[str, Any]]:
    """Step ``step``'s agents on record (``prefix``: a validation's) and the line of :func:`no_call_line`; the
    records."""
    records = agent_records(episodes, validation=bool(prefix))
    write_records(run_dir, step, records, prefix)
    line = no_call_line(episodes, f"step {step}" if not prefix else f"{prefix} at step {step}")
    if line:
        log(line)
    return records


def read_records(run_dir: str | os.PathLike) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Every agents file of a run: ``{(prefix, step): records}`` (prefix ``""`` for training, ``val``,
    ``warmup_val``), in order."""
    folder = Path(run_dir) / FOLDER
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        found = _FILE.match(path.name)
        if found:
            key = (found.group("prefix") or "", int(found.group("step")))
            out[key] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0])))
