"""How validation episodes fail: invalid actions, and what the policy does right after one.

    python bench/failure_modes.py RUN_DIR/validation/val_step_000020.jsonl [more.jsonl ...]

Each file is one validation's episodes as a run writes them (``validation/*.jsonl``). An action is invalid when
the env said so (``info["invalid"]`` on its turn; in BabyAI, e.g. ``go to grey key 1`` with no grey key in view).
One row per file:

- failed: episodes without success; of those, how many had an invalid action, and how many began with one;
- after an invalid action: the turns that directly follow one, and how many of them repeat the invalid action
  word for word (a greedy policy that repeats it is stuck for the rest of the episode);
- recovered: successful episodes that had an invalid action.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


# (key, column header), in the table's order
COLUMNS = [("episodes", "episodes"), ("success", "success"), ("failed", "failed"),
           ("failed_invalid", "failed with an invalid action"),
           ("failed_first_invalid", "failed with an invalid first action"),
           ("after_invalid", "turns after an invalid action"), ("repeats", "of which repeat it"),
           ("recovered", "recovered")]


def count(path: Path) -> dict:
    episodes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    row = dict.fromkeys((key for key, _ in COLUMNS), 0)
    row["episodes"] = len(episodes)
    for ep in episodes:
        turns = ep["turns"]
        invalid = [bool((t.get("info") or {}).get("invalid")) for t in turns]
        for prev, cur, was_invalid in zip(turns, turns[1:], invalid):
            if was_invalid:
                row["after_invalid"] += 1
                row["repeats"] += cur["action"]["content"] == prev["action"]["content"]
        if ep["success"]:
            row["success"] += 1
            row["recovered"] += any(invalid)
        else:
            row["failed"] += 1
            row["failed_invalid"] += any(invalid)
            row["failed_first_invalid"] += bool(invalid[:1] and invalid[0])
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    files = p.parse_args().files
    print("| file | " + " | ".join(header for _, header in COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for f in files:
        row = count(f)
        print(f"| {f} | " + " | ".join(str(row[key]) for key, _ in COLUMNS) + " |")


if __name__ == "__main__":
    main()
