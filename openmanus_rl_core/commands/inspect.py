"""``openmanus-rl inspect <run>``: what a run trained on, step by step, from its rollout dumps (run/dumps.py).

Prints one line per dumped step: its samples and tasks, success rate, mean reward, the groups left out (and why),
the staleness of its samples (policy versions between the weights that generated a sample's oldest token and the
ones it trained), its env_error samples, and the most common last observation of its failed samples. A run with an
agent (``agent.command`` / ``agent.function``) also gets its env_error episodes listed from ``<run>/agents/``
(run/agents.py: which tasks, which errors, per step and per validation), with or without dumps. Writes
``<run>/rollouts/inspect.html``: the same table, then every sample of the chosen steps (``--steps K..M``, default the
last one) as the rollout command's browser shows episodes: the prompt, each reply and the observation after it,
decoded with the run's tokenizer, and the reward per component.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.run.agents import FOLDER as AGENTS_FOLDER
from openmanus_rl_core.run.agents import read_records


def inspect_run(args: argparse.Namespace) -> int:
    """The command (module docstring); ``args.run_dir``, ``args.steps``."""
    from openmanus_rl_core.rollout.chat import ChatDelta
    from openmanus_rl_core.rollout.records import write_html
    from openmanus_rl_core.run.dumps import FOLDER, dump_path, dumped_steps, read_dump

    run = Path(args.run_dir)
    folder = run / FOLDER
    steps = dumped_steps(folder)
    agents = read_records(run)
    if not steps:
        if agents:  # an agent run without dumps: what its agents did is still on record
            _print_env_errors(agents, run)
            return 0
        raise ConfigError(f"{run}: no rollout dumps in {folder} (a run writes them with trainer.save_rollouts=true) "
                          f"and no agent records in {run / AGENTS_FOLDER}")
    chosen = _chosen(args.steps, steps)
    chat = ChatDelta(_tokenizer(run))
    rows, records = [], []
    print(f"{'step':>5} {'samples':>7} {'tasks':>5} {'success':>7} {'reward':>8} {'dropped':>12}  staleness  "
          f"env_error  most common failure")
    for step in steps:
        batch = read_dump(dump_path(folder, step))
        row = _step_row(step, batch, folder, chat)
        rows.append(row)
        print(f"{step:>5} {row['samples']:>7} {row['tasks']:>5} {row['success']:>7.3f} {row['reward']:>8.3f} "
              f"{row['dropped']:>12}  {row['staleness']:<9}  {row['env_error']:>9}  {row['failure']}")
        if step in chosen:
            records += _records(step, batch, chat, len(records))
    summary = {f"step {r['step']}": f"{r['samples']} samples, {r['tasks']} tasks, success {r['success']:.3f}, reward "
               f"{r['reward']:.3f}, dropped {r['dropped']}, staleness {r['staleness']}, env_error {r['env_error']}"
               for r in rows}
    if agents:
        _print_env_errors(agents, run)
    page = write_html(folder / "inspect.html", records, summary, title=f"openmanus-rl inspect: {run}")
    print(f"browser over steps {', '.join(map(str, sorted(chosen)))}: {page}")
    return 0


ERROR_CHARS = 160  # how much of an error one line of the listing shows


def _print_env_errors(agents: dict[tuple[str, int], list[dict[str, Any]]], run: Path) -> None:
    """The agent run's env_error episodes, per step (and validation): how many, and each error with its tasks."""
    failed = {key: [r for r in records if r.get("termination") == "env_error"] for key, records in agents.items()}
    total = sum(map(len, failed.values()))
    print(f"agents: {sum(map(len, agents.values()))} episodes on record in {run / AGENTS_FOLDER}, {total} env_error")
    for (prefix, step), bad in failed.items():
        if not bad:
            continue
        where = f"step {step}" + (f" ({prefix.replace('_', '/')})" if prefix else "")
        print(f"  {where}: {len(bad)} of {len(agents[(prefix, step)])} env_error")
        by_error: dict[str, list[str]] = {}
        for r in bad:
            by_error.setdefault(str(r.get("error") or "no error given"), []).append(str(r.get("task_id")))
        for error, tasks in sorted(by_error.items(), key=lambda kv: -len(kv[1])):
            shown = error if len(error) <= ERROR_CHARS else error[:ERROR_CHARS - 3] + "..."
            print(f"    {len(tasks)}x {shown} (tasks {', '.join(tasks[:8])}{', ...' if len(tasks) > 8 else ''})")


def _chosen(given: str | None, steps: list[int]) -> set[int]:
    if not given:
        return {steps[-1]}
    first, _, last = given.partition("..")
    try:
        lo, hi = int(first), int(last or first)
    except ValueError:
        raise ConfigError(f"--steps {given}: must be K..M or K") from None
    chosen = {k for k in steps if lo <= k <= hi}
    if not chosen:
        raise ConfigError(f"--steps {given}: no dump of those steps (the run has steps {steps[0]}..{steps[-1]})")
    return chosen


def _tokenizer(run: Path) -> Any:
    """The run's tokenizer: its model folder's (the tiny model's, or ``model.path``)."""
    from transformers import AutoTokenizer

    settings = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    own = run / "model"
    folder = own if own.is_dir() else Path(str((settings.get("model") or {}).get("path") or own))
    return AutoTokenizer.from_pretrained(str(folder))


def _observation(chat: Any, ids: list[int]) -> str:
    """An observation's own text: the tokens between a reply and the next one, less the chat template's pieces
    around a user turn (:class:`~openmanus_rl_core.rollout.chat.ChatDelta`)."""
    for head in (chat.mid_ids, chat.mid_ids[len(chat.end_ids):]):  # the end of turn is left out after an EOS
        if head and ids[:len(head)] == head:
            ids = ids[len(head):]
            break
    tail = chat.tail_ids
    if tail and ids[-len(tail):] == tail:
        ids = ids[:-len(tail)]
    return chat.tokenizer.decode(ids)


def _segments(batch: Any, i: int) -> tuple[list[int], list[tuple[bool, list[int]]]]:
    """Row ``i``'s prompt tokens and its response as runs of (generated?, tokens), padding left out."""
    width = batch["responses"].shape[1]
    prompt_len = batch["input_ids"].shape[1] - width
    attention = batch["attention_mask"][i].tolist()
    prompt = [t for t, a in zip(batch["input_ids"][i, :prompt_len].tolist(), attention[:prompt_len]) if a]
    runs: list[tuple[bool, list[int]]] = []
    for t, a, m in zip(batch["responses"][i].tolist(), attention[prompt_len:], batch["response_mask"][i].tolist()):
        if not a:
            continue
        if runs and runs[-1][0] == (m > 0):
            runs[-1][1].append(t)
        else:
            runs.append((m > 0, [t]))
    return prompt, runs


def _step_row(step: int, batch: Any, folder: Path, chat: Any) -> dict[str, Any]:
    nt = batch.non_tensors
    versions, mask = batch["versions"], batch["response_mask"] > 0
    ages: Counter = Counter()
    for i in range(len(batch)):
        made = versions[i][mask[i] & (versions[i] >= 0)]
        if made.numel():
            ages[(step - 1) - int(made.min())] += 1  # step k trains the weights of k - 1 updates
    failures: Counter = Counter()
    for i in range(len(batch)):
        if not nt["success"][i]:
            observations = [_observation(chat, ids) for gen, ids in _segments(batch, i)[1] if not gen]
            failures[(observations[-1] if observations else nt["termination"][i]).strip()[:60]] += 1
    dropped_file = folder / f"dropped_{step:06d}.jsonl"
    reasons = Counter(json.loads(line)["reason"] for line in dropped_file.read_text().splitlines()) \
        if dropped_file.is_file() else Counter()
    top = failures.most_common(1)
    return {"step": step, "samples": len(batch), "tasks": len(set(nt["task_id"])),
            "env_error": sum(t == "env_error" for t in nt["termination"]),
            "success": sum(map(bool, nt["success"])) / max(1, len(batch)),
            "reward": sum(nt["reward"]) / max(1, len(batch)),
            "dropped": " ".join(f"{r}:{c}" for r, c in sorted(reasons.items())) or "0",
            "staleness": " ".join(f"{a}:{c}" for a, c in sorted(ages.items())) or "-",
            "failure": f"{top[0][1]}x {top[0][0]!r}" if top else "-"}


def _records(step: int, batch: Any, chat: Any, first: int) -> list[dict[str, Any]]:
    """The step's samples as the rollout browser's episode records (rollout/records.py)."""
    nt = batch.non_tensors
    out = []
    for i in range(len(batch)):
        prompt, runs = _segments(batch, i)
        turns, k = [], 0
        for j, (generated, ids) in enumerate(runs):
            if not generated:
                continue
            after = runs[j + 1][1] if j + 1 < len(runs) and not runs[j + 1][0] else []
            turns.append({"turn": k, "response": chat.tokenizer.decode(ids), "observation": _observation(chat, after),
                          "action": {}, "span": [], "done": j + 2 >= len(runs)})
            k += 1
        out.append({"index": first + i, "task_id": f"{nt['task_id'][i]} (step {step})", "group_id": nt["group_id"][i],
                    "success": bool(nt["success"][i]), "termination": nt["termination"][i], "num_turns": len(turns),
                    "reward": nt["reward"][i], "reward_parts": nt["reward_parts"][i], "prompt_tokens": len(prompt),
                    "response_tokens": sum(len(ids) for _, ids in runs),
                    "agent_tokens": sum(len(ids) for gen, ids in runs if gen), "truncated": "-",
                    "initial_observation": chat.tokenizer.decode(prompt), "turns": turns})
    return out
