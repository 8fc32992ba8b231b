"""``openmanus-rl data from-rollouts``: a rollout of key_door by a served expert that fails some tasks (a fake
OpenAI-compatible server) becomes a parquet file in OpenManus-RL's layout plus our demonstration column; only the
successes are kept, ``data verify`` replays every kept row, and the warm-up builds its demonstrations from the file
alone (an env without an oracle)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from openmanus_rl_core.cli import main as cli_main
from openmanus_rl_core.data.openmanus_layout import OPENMANUS_COLUMNS
from openmanus_rl_core.data.tasks import load_tasks
from tests.fake_openai import FakeOpenAI, key_door_oracle


@pytest.fixture(scope="module")
def rollout_dir(tmp_path_factory) -> Path:
    from openmanus_rl_core.models.loading import load_tokenizer
    from tests.tiny_hf import save_tiny

    folder = tmp_path_factory.mktemp("from_rollouts")
    model_dir = save_tiny("llama", folder / "llama")
    expert = key_door_oracle(load_tokenizer(str(model_dir)))

    def reply(body: dict) -> str:  # an expert that says a wrong word when the password has an odd length
        text = expert(body)
        word = re.search(r"say (\w+)", text)
        return "<action>say nope</action>" if word and len(word.group(1)) % 2 else text

    out = folder / "rollout"
    with FakeOpenAI(reply) as server:
        assert cli_main(["rollout", "env=key_door", f"model.path={model_dir}", "rollout.engine=openai",
                         f"rollout.engine_kwargs.base_url={server.url}", "rollout.engine_kwargs.model=served",
                         "rollout.num_tasks=8", "rollout.n=2", "rollout.greedy=true",
                         f"rollout.output_dir={out}"]) == 0
    return out


def test_the_successes_become_rows_of_openmanus_layout_with_our_demonstrations(rollout_dir, capsys):
    records = [json.loads(line) for line in (rollout_dir / "trajectories.jsonl").read_text().splitlines()]
    wins = [r for r in records if r["success"]]
    assert 0 < len(wins) < len(records)
    capsys.readouterr()
    assert cli_main(["data", "from-rollouts", "env=key_door", f"data.rollouts={rollout_dir}"]) == 0
    out = rollout_dir / "demonstrations.parquet"
    # n=2 with greedy replies: each task's two episodes are the same, one row is kept per successful task.
    assert f"16 episodes, {len(wins)} with success, {len(wins) // 2} after dropping repeats" in capsys.readouterr().out
    table = pq.read_table(out)
    assert set(OPENMANUS_COLUMNS) | {"task_id", "seed", "demonstration"} <= set(table.column_names)
    row = table.slice(0, 1).to_pylist()[0]
    win = next(r for r in wins if r["task_id"] == row["task_id"])
    assert [t["from"] for t in row["conversations"]] == ["human", "gpt", "human", "gpt", "human", "gpt", "human"]
    assert row["conversations"][3] == {"from": "gpt", "loss": True, "value": "<action>open box</action>"}
    assert row["item_id"] == f"key_door_{win['task_id']}" and row["seed"] == win["seed"]
    tasks = load_tasks(out)
    assert tasks[0]["demonstration"]["steps"][0] == ["open box", win["turns"][0]["observation"]]
    assert (tasks[0]["task_id"], tasks[0]["seed"]) == (win["task_id"], win["seed"])


def test_data_verify_replays_the_kept_rows_and_fails_on_kept_failures(rollout_dir, tmp_path, capsys):
    kept = tmp_path / "wins.parquet"
    assert cli_main(["data", "from-rollouts", "env=key_door", f"data.rollouts={rollout_dir}",
                     f"data.output={kept}"]) == 0
    assert cli_main(["data", "verify", "env=key_door", f"data.val_files={kept}"]) == 0
    n = pq.read_metadata(kept).num_rows
    assert f"key_door: {n}/{n} demonstrations succeed (success rate 1.000)" in capsys.readouterr().out
    everything = tmp_path / "all.parquet"
    assert cli_main(["data", "from-rollouts", "env=key_door", f"data.rollouts={rollout_dir / 'trajectories.jsonl'}",
                     "data.keep=reward", "data.min_reward=-100", f"data.output={everything}"]) == 0
    assert cli_main(["data", "verify", "env=key_door", f"data.val_files={everything}"]) == 1
    assert "no success after all 4 actions" in capsys.readouterr().out


def test_the_warm_up_builds_its_demonstrations_from_the_file_alone(rollout_dir, tmp_path):
    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.run.warmup import build_demonstrations

    out = tmp_path / "demos.parquet"
    assert cli_main(["data", "from-rollouts", "env=key_door", f"data.rollouts={rollout_dir}",
                     f"data.output={out}"]) == 0
    tasks = load_tasks(out)

    class NoOracle:  # the key_door env without its oracle: every demonstration must come from the file
        instruction = "Open the door. Actions: open box, say <word>."

        def close(self) -> None:
            pass

    template = build("template", {"name": "react", "kwargs": {}})
    tok = build_tokenizer(["<action>open box</action>", "The box is open. The note says: apple."], vocab_size=300)
    demos = build_demonstrations(NoOracle, template, tok, tasks, max_turns=4)
    assert len(demos) == len(tasks)
    ids, mask = demos[0]
    replies = tok.decode([t for t, m in zip(ids, mask) if m])
    password = tasks[0]["demonstration"]["steps"][1][0]
    assert replies == f"<action>open box</action><action>{password}</action>"


def test_no_kept_episode_writes_nothing_and_exits_1(rollout_dir, tmp_path, capsys):
    out = tmp_path / "none.parquet"
    assert cli_main(["data", "from-rollouts", "env=key_door", f"data.rollouts={rollout_dir}", "data.keep=reward",
                     "data.min_reward=5", f"data.output={out}"]) == 1
    assert "no episode is kept" in capsys.readouterr().err and not out.exists()


def test_keep_reward_keeps_an_episode_whose_reward_equals_the_minimum(tmp_path, capsys):
    """``data.keep=reward`` keeps ``reward >= data.min_reward``: the episode at exactly the minimum is kept, the one
    just under it is not (three hand-written episodes of different tasks)."""
    def episode(task_id: int, reward: float) -> dict:
        return {"task_id": task_id, "seed": 0, "task": {"task_id": task_id, "seed": 0}, "reward": reward,
                "success": reward == 1.0, "initial_observation": f"room {task_id}",
                "turns": [{"response": "<action>open box</action>", "action": {"content": "open box"},
                           "observation": "The box is open."}]}

    rollouts = tmp_path / "trajectories.jsonl"
    rollouts.write_text("".join(json.dumps(episode(t, r)) + "\n" for t, r in [(0, 1.0), (1, 0.5), (2, 0.25)]))
    out = tmp_path / "kept.parquet"
    assert cli_main(["data", "from-rollouts", "env=key_door", f"data.rollouts={rollouts}", "data.keep=reward",
                     "data.min_reward=0.5", f"data.output={out}"]) == 0
    assert f"{rollouts}: 3 episodes, 2 with reward >= 0.5, 2 after dropping repeats" in capsys.readouterr().out
    rows = pq.read_table(out, columns=["task_id", "reward"]).to_pylist()
    assert rows == [{"task_id": 0, "reward": 1.0}, {"task_id": 1, "reward": 0.5}]
