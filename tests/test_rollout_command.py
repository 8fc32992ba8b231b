"""``openmanus-rl rollout`` (openmanus_rl_core/commands/rollout.py)."""

from __future__ import annotations

import json

import pytest

from openmanus_rl_core.commands.rollout import load_task_rows, rollout
from openmanus_rl_core.rollout.records import write_html

# Small and fast: the embedded tiny model shrunk further, short replies.
FAST = [
    "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320",
    "rollout.max_new_tokens=8", "rollout.max_turns=2",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _compose(overrides):
    """The checked, typed config as the CLI hands it to the job."""
    from openmanus_rl_core.config.loading import load

    return load(["env=key_door", *FAST, *overrides], training=False)


def test_rollout_job_writes_jsonl_and_html(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = _compose([f"rollout.output_dir={out}", "rollout.num_tasks=3", "rollout.n=2", "rollout.batch_size=4"])
    assert rollout(cfg) == 0
    printed = capsys.readouterr().out
    for words in ("success rate:", "mean reward:", "mean turns:", "throughput:"):
        assert words in printed
    lines = (out / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 6
    assert [r["task_id"] for r in records] == [0, 0, 1, 1, 2, 2]
    assert records[0]["group_id"] == records[1]["group_id"] != records[2]["group_id"]
    for r in records:
        assert r["termination"] in ("done", "max_turns", "invalid", "truncated")
        assert 1 <= r["num_turns"] <= 2
        assert set(r["reward_parts"]) == {"goal", "format", "invalid_action"}
        assert r["reward"] == pytest.approx(sum(r["reward_parts"].values()))
        t = r["turns"][0]
        assert {"response", "action", "observation", "env_reward", "reward", "span"} <= set(t)
    page = (out / "trajectories.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()
    assert "A locked door and a closed box." in page  # key_door's first observation
    assert "goal" in page and "invalid_action" in page
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["rollout/episodes"] == 6


def test_rollout_job_reads_a_task_file(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"task_id": t, "seed": 5}) for t in (4, 9)) + "\n")
    out = tmp_path / "run"
    cfg = _compose([f"rollout.output_dir={out}", f"rollout.tasks_file={tasks}", "rollout.greedy=true",
                    "rollout.n=1"])
    assert load_task_rows(cfg) == [{"task_id": 4, "seed": 5}, {"task_id": 9, "seed": 5}]
    assert rollout(cfg) == 0
    records = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == [4, 9] and all(r["seed"] == 5 for r in records)


def test_default_tasks_come_from_num_tasks():
    cfg = _compose(["rollout.num_tasks=3", "rollout.task_offset=10", "seed=1"])
    assert load_task_rows(cfg) == [{"task_id": 10, "seed": 11}, {"task_id": 11, "seed": 12},
                                   {"task_id": 12, "seed": 13}]


def test_html_escapes_everything(tmp_path):
    evil = "<script>alert('x')</script> & <b>bold</b>"
    record = {
        "index": 0, "task_id": evil, "group_id": evil, "success": False, "termination": "done", "error": evil,
        "num_turns": 1, "reward": 0.5, "reward_parts": {evil: 0.5}, "reward_errors": {"f": evil},
        "initial_observation": evil, "truncated": False, "prompt_tokens": 1, "response_tokens": 1,
        "agent_tokens": 1,
        "turns": [{"turn": 0, "response": evil, "action": {"kind": evil, "content": evil, "valid": False},
                   "observation": evil, "env_reward": 0.0, "reward": 0.5, "done": True, "info": {"k": evil},
                   "span": [0, 1]}],
    }
    path = write_html(tmp_path / "t.html", [record], {evil: evil}, title=evil)
    page = path.read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page


def test_an_unwritable_output_dir_fails_before_any_work(tmp_path, capsys):
    import time as _time

    from openmanus_rl_core.cli import main as cli_main

    blocker = tmp_path / "file"
    blocker.write_text("")
    t0 = _time.perf_counter()
    assert cli_main(["rollout", "env=word_copy", f"rollout.output_dir={blocker / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert f"rollout.output_dir={blocker / 'out'}: cannot write the rollout there" in err
    assert _time.perf_counter() - t0 < 5  # no model was built, no episode played
