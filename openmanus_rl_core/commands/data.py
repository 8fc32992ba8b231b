"""``openmanus-rl data make`` (task files for an env), ``openmanus-rl data verify`` (replay a data set's
demonstrations through the env) and ``openmanus-rl data from-rollouts`` (a rollout's good episodes as demonstrations)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

import pyarrow.parquet as pq

from openmanus_rl_core.data.tasks import DataError, load_tasks
from openmanus_rl_core.data.generation import write_split_files


def make(cfg: Any) -> int:
    """``openmanus-rl data make env=<name>``: write ``train.parquet`` and ``val.parquet`` into ``data.dir``."""
    paths = write_split_files(cfg, Path(cfg.data.dir).expanduser())
    for split, p in paths.items():
        n = pq.read_metadata(p).num_rows
        print(f"{split}: {p} ({n} tasks)")
    return 0


def verify(cfg: Any) -> int:
    """``openmanus-rl data verify env=<name> data.val_files=<file>``: replay each row's demonstration in the env.

    Each row's task is started as the rollout starts it (by content where the row and the env allow), then the
    demonstration's actions are sent in order. A row passes when the env reports success (``info["success"]``, or
    ``done`` for an env that reports no success) by the end of its actions. Prints the success rate and every
    failing row (index, ``item_id``, why); exits 1 when any row fails (a row without a demonstration fails too),
    so a script can stop on a dataset that does not agree with the env version.
    """
    from openmanus_rl_core.plugin.envs import open_env_service
    from openmanus_rl_core.plugin.registry import registry
    from openmanus_rl_core.rollout import start_task

    files = cfg.data.val_files
    if not files:
        raise DataError("data verify needs data.val_files=<parquet file> (a file with demonstrations, e.g. "
                        "OpenManus-RL's layout)")
    tasks = load_tasks(files)
    name = cfg.env.name
    factory = registry("env").get(name)
    service = open_env_service(name, factory, cfg.env.kwargs, at_once=1)  # one row replayed at a time
    failures: list[str] = []
    try:
        for i, task in enumerate(tasks):
            why = _replay(factory, service.kwargs, task, start_task)
            if why:
                failures.append(f"  row {i} ({task.get('item_id') or task.get('task_id')}): {why}")
    finally:
        service.close()
    n = len(tasks)
    print(f"{name}: {n - len(failures)}/{n} demonstrations succeed (success rate "
          f"{(n - len(failures)) / n if n else float('nan'):.3f}) in {files}")
    if failures:
        print(f"failing rows ({len(failures)}):")
        print("\n".join(failures))
    return 1 if failures else 0


def _replay(factory: Any, kwargs: Mapping[str, Any], task: Mapping[str, Any], start_task: Any) -> str | None:
    """Why the row's demonstration does not succeed in the env, or None when it does."""
    demo = task.get("demonstration")
    if not demo or not demo.get("steps"):
        return "no demonstration"
    env = factory(**kwargs)
    try:
        start_task(env, task)
        for k, (action, _) in enumerate(demo["steps"]):
            res = env.step(action)
            success = res.info.get("success") if isinstance(res.info, Mapping) else None
            if success or (success is None and res.done):
                return None
            if res.done:
                return f"the episode ended at action {k + 1} ({action!r}) without success: {res.observation[:120]!r}"
        return f"no success after all {len(demo['steps'])} actions; last observation {res.observation[:120]!r}"
    except Exception as exc:  # an env error is this row's failure, not the end of the check
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        env.close()


# ------------------------------------------------------------------------------------- data from-rollouts
ACK = "OK. I'll follow your instructions and try my best."  # AgentGym's reply to the instruction turn


def episode_row(record: Mapping[str, Any], env: str, instruction: str, index: int) -> dict:
    """One rollout episode (a line of ``trajectories.jsonl``) as a row of OpenManus-RL's layout plus our columns.

    ``conversations``: AgentGym's shape: the instruction (a human turn) and its acknowledgement, the first
    observation, then each reply (``loss`` true) and the observation after it. ``demonstration``: ``{observation,
    steps: [[action, observation], ...]}`` with the actions as the template parsed them (what the env took), so
    ``data verify`` replays them and the warm-up renders them with the run's template. ``task_id`` and ``seed``
    start the very task again.
    """
    turns = record.get("turns") or []
    conv = [{"from": "human", "loss": None, "value": instruction},
            {"from": "gpt", "loss": False, "value": ACK},
            {"from": "human", "loss": None, "value": str(record.get("initial_observation") or "")}]
    for t in turns:
        conv.append({"from": "gpt", "loss": True, "value": str(t.get("response") or "")})
        if t.get("observation"):
            conv.append({"from": "human", "loss": None, "value": str(t["observation"])})
    task = record.get("task") or {}
    task_id = record.get("task_id")
    return {
        "data_source": env, "item_id": f"{env}_{task_id if task_id is not None else index}",
        "conversations": conv, "prompt": [{"content": conv[2]["value"], "role": "user"}], "ability": env,
        "reward_model": {"ground_truth": None if task.get("ground_truth") is None else str(task["ground_truth"]),
                         "style": "rule"},
        "extra_info": {"conversations": json.dumps(conv, ensure_ascii=False), "index": index, "split": "train"},
        "task_id": task_id, "seed": record.get("seed"),
        "demonstration": {"observation": conv[2]["value"],
                          "steps": [[str((t.get("action") or {}).get("content") or ""), str(t.get("observation") or "")]
                                    for t in turns]},
        "reward": float(record.get("reward") or 0.0),
    }


def from_rollouts(cfg: Any) -> int:
    """``openmanus-rl data from-rollouts env=<name> data.rollouts=<rollout folder or trajectories.jsonl>``.

    Keeps the episodes that succeeded (``data.keep=success``) or whose reward is at least ``data.min_reward``
    (``data.keep=reward``), drops exact repeats (same task, same actions), and writes them as one parquet file
    (``data.output``): OpenManus-RL's columns plus ``task_id``, ``seed``, ``demonstration`` and ``reward``
    (:func:`episode_row`). ``env`` and ``template`` should be the rollout's: the instruction turn is the template's
    system prompt for the env. Exit 1 when no episode is kept.
    """
    import pyarrow as pa

    from openmanus_rl_core.data.openmanus_layout import OPENMANUS_SCHEMA
    from openmanus_rl_core.plugin.registry import build

    if not cfg.data.rollouts:
        raise DataError("data from-rollouts needs data.rollouts=<the rollout's folder or its trajectories.jsonl>")
    src = Path(cfg.data.rollouts).expanduser()
    src = src / "trajectories.jsonl" if src.is_dir() else src
    if not src.is_file():
        raise DataError(f"data.rollouts={cfg.data.rollouts}: no such file ({src}); give the folder "
                        f"`openmanus-rl rollout` wrote, or its trajectories.jsonl")
    records = []
    with open(src, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{src}: line {n} is not JSON ({exc.msg}); is it a rollout's trajectories.jsonl?")
    env = build("env", cfg.env)
    try:
        instruction = build("template", cfg.template).system_prompt(str(getattr(env, "instruction", "") or ""))
    finally:
        env.close()
    keep_rules = {  # data.keep -> (which episodes are kept, in words)
        "success": (lambda r: bool(r.get("success")), "success"),
        "reward": (lambda r: float(r.get("reward") or 0.0) >= cfg.data.min_reward,
                   f"reward >= {cfg.data.min_reward:g}"),
    }
    keeps, rule = keep_rules[cfg.data.keep]
    kept = [r for r in records if keeps(r)]
    rows, seen = [], set()
    for r in kept:
        row = episode_row(r, cfg.env.name, instruction, len(rows))
        key = (row["task_id"], row["seed"], json.dumps(row["demonstration"]["steps"]))
        if key not in seen:
            seen.add(key)
            rows.append(row)
    print(f"{src}: {len(records)} episodes, {len(kept)} with {rule}, {len(rows)} after dropping repeats")
    if not rows:
        print("error: no episode is kept; nothing written", file=sys.stderr)
        return 1
    schema = pa.schema(list(OPENMANUS_SCHEMA) + [
        pa.field("task_id", pa.int64()), pa.field("seed", pa.int64()),
        pa.field("demonstration", pa.struct([("observation", pa.string()),
                                             ("steps", pa.list_(pa.list_(pa.string())))])),
        pa.field("reward", pa.float64())])
    out = Path(cfg.data.output).expanduser() if cfg.data.output else src.parent / "demonstrations.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out)
    print(f"wrote {out} ({len(rows)} demonstrations; replay them with `openmanus-rl data verify env={cfg.env.name} "
          f"data.val_files={out}`, warm up on them with data.train_files={out})")
    return 0
