"""OpenManus-RL's published task layout (one row per AgentGym item, with its conversation), read as tasks with a
demonstration: :func:`~openmanus_rl_core.data.tasks.load_tasks` detects the layout by its columns and hands the file here.

Columns: ``data_source, item_id, conversations, prompt, ability, reward_model, extra_info``. A row becomes a task
with a demonstration (for the warm-up and ``openmanus-rl data verify``), the task's first observation (a task by
content) and the ground truth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa

from openmanus_rl_core.data.columns import COLUMNS, DataError

__all__ = ["OPENMANUS_COLUMNS", "OPENMANUS_SCHEMA", "read_openmanus", "conversation_demonstration"]

OPENMANUS_COLUMNS = ("data_source", "item_id", "conversations", "prompt", "ability", "reward_model", "extra_info")
# Their arrow types in OpenManus-RL's published files (what a writer of such a file uses).
OPENMANUS_SCHEMA = pa.schema([
    ("data_source", pa.string()), ("item_id", pa.string()),
    ("conversations", pa.list_(pa.struct([("from", pa.string()), ("loss", pa.bool_()), ("value", pa.string())]))),
    ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
    ("extra_info", pa.struct([("conversations", pa.string()), ("index", pa.int64()), ("split", pa.string())])),
])


def conversation_demonstration(turns: Sequence[Mapping[str, Any]]) -> dict | None:
    """An AgentGym conversation as a demonstration: ``{"observation": str, "steps": [[action, observation], ...]}``.

    ``turns``: ``{"from": "human"|"gpt", "loss": bool|None, "value": str}``. The turns to learn (``loss`` true) are
    the agent's; each one's action is the first line after its last ``Action:``, its observation the human turn
    after it ("" after the last). The first observation is the human turn before the first agent turn (the turns
    before it are AgentGym's instruction and the model's acknowledgement). None without an agent turn.
    """
    agent = [i for i, t in enumerate(turns) if t.get("from") == "gpt" and t.get("loss")]
    if not agent or agent[0] == 0 or turns[agent[0] - 1].get("from") != "human":
        return None
    steps = []
    for i in agent:
        reply = str(turns[i].get("value") or "")
        tail = reply.rpartition("Action:")[2] if "Action:" in reply else reply
        action = next((line.strip() for line in tail.splitlines() if line.strip()), "")
        after = turns[i + 1] if i + 1 < len(turns) and turns[i + 1].get("from") == "human" else None
        steps.append([action, str(after.get("value") or "") if after else ""])
    return {"observation": str(turns[agent[0] - 1].get("value") or ""), "steps": steps}


def read_openmanus(path: Path, table: pa.Table) -> list[dict]:
    """Tasks from a file in OpenManus-RL's layout (one row per AgentGym item).

    Per row: ``task_id`` is the index in ``item_id`` (``"textcraft_31"`` -> 31, AgentGym's ``data_idx``), ``seed``
    0; ``observation`` is the first observation of the conversation, so an env that can start a task from it
    (``reset_from_observation``) plays that very task whatever its index means on this machine; ``demonstration``
    is the conversation as :func:`conversation_demonstration` reads it; ``ground_truth`` is
    ``reward_model.ground_truth``; ``extra`` is ``extra_info`` (without its copy of the conversation); ``prompt``,
    ``ability`` and ``item_id`` pass through. Columns ``task_id``, ``seed`` and ``demonstration`` (``{observation,
    steps}``), when the file has them besides the layout, are used as they are.
    """
    # Our own columns, when a file carries them next to the layout (``data from-rollouts`` writes them), win over
    # what the layout implies: the exact task (task_id, seed) and the demonstration's actions as the env takes them.
    ours = [c for c in ("task_id", "seed", "demonstration") if c in table.column_names]
    rows = table.select(list(OPENMANUS_COLUMNS) + ours).to_pylist()
    tasks = []
    for i, row in enumerate(rows):
        item = str(row["item_id"] or "")
        index = item.rpartition("_")[2]
        if not index.isdigit():
            raise DataError(f"{path}: column 'item_id' row {i}: {item!r} does not end in _<index> "
                            f"(expected e.g. 'textcraft_31')")
        turns = row["conversations"] or []
        if not isinstance(turns, list) or not all(isinstance(t, Mapping) for t in turns):
            raise DataError(f"{path}: column 'conversations' row {i}: expected a list of {{from, loss, value}}, "
                            f"got {type(turns).__name__}")
        demo = row["demonstration"] if row.get("demonstration") else conversation_demonstration(turns)
        extra = {k: v for k, v in (row["extra_info"] or {}).items() if k != "conversations"}
        task: dict[str, Any] = {c: None for c in COLUMNS}
        task.update(
            task_id=int(index) if row.get("task_id") is None else int(row["task_id"]),
            seed=0 if row.get("seed") is None else int(row["seed"]), data_source=row["data_source"], prompt=row["prompt"],
            ground_truth=(row["reward_model"] or {}).get("ground_truth"), extra=extra, split=extra.get("split"),
            item_id=item, ability=row["ability"], demonstration=demo,
            observation=demo["observation"] if demo else None,
        )
        tasks.append(task)
    return tasks
