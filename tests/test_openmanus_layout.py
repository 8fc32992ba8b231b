"""OpenManus-RL's parquet layout end to end on the in-process TextCraft: a small file in that layout (expert
conversations written from the env's oracle, item_ids whose indices mean nothing here), read by load_tasks, replayed
by `openmanus-rl data verify`, and trained from with the warm-up on its conversations."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("openmanus_rl_env_textcraft")

from openmanus_rl_core.cli import main as cli_main  # noqa: E402
from openmanus_rl_core.data.openmanus_layout import OPENMANUS_SCHEMA  # noqa: E402
from openmanus_rl_core.data.tasks import load_tasks  # noqa: E402

def expert_row(task_id: int, item: str, keep_actions: int | None = None) -> dict:
    """One row in OpenManus-RL's layout: AgentGym's conversation of the oracle playing ``task_id`` (cut to
    ``keep_actions`` actions, which makes a demonstration that does not succeed)."""
    from openmanus_rl_env_textcraft.env import TextCraftEnv

    env = TextCraftEnv()
    first = env.reset(task_id=task_id, seed=0)
    conv = [{"from": "human", "loss": None, "value": env.instruction},
            {"from": "gpt", "loss": False, "value": "OK. I'll follow your instructions and try my best."},
            {"from": "human", "loss": None, "value": first}]
    done, n = False, 0
    while not done and (keep_actions is None or n < keep_actions):
        action = env.oracle_action()
        result = env.step(action)
        conv += [{"from": "gpt", "loss": True, "value": f"Thought: I need this next.\nAction: {action}"},
                 {"from": "human", "loss": None, "value": result.observation}]
        done, n = result.done, n + 1
    goal = first.rstrip().splitlines()[-1]
    return {"data_source": "textcraft", "item_id": item, "conversations": conv,
            "prompt": [{"content": first, "role": "user"}], "ability": "textcraft",
            "reward_model": {"ground_truth": goal, "style": "rule"},
            "extra_info": {"conversations": json.dumps(conv), "index": task_id, "split": "train"}}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("openmanus")
    good = [expert_row(0, "textcraft_518"), expert_row(7, "textcraft_31"), expert_row(20, "textcraft_2")]
    mixed = good + [expert_row(40, "textcraft_810", keep_actions=1)]
    paths = folder / "good.parquet", folder / "mixed.parquet"
    for path, rows in zip(paths, (good, mixed)):
        pq.write_table(pa.Table.from_pylist(rows, schema=OPENMANUS_SCHEMA), path)
    return paths


def test_rows_carry_task_content_demonstration_and_ground_truth(files):
    tasks = load_tasks(files[1])
    assert [t["task_id"] for t in tasks] == [518, 31, 2, 810]  # AgentGym's indices, kept as given
    for t in tasks:
        assert t["observation"].startswith("Crafting commands:") and "Goal: craft" in t["observation"]
        assert t["ground_truth"] == t["observation"].rstrip().splitlines()[-1]
        assert t["demonstration"]["steps"] and t["extra"]["split"] == "train"
    assert len(tasks[3]["demonstration"]["steps"]) == 1


def test_data_verify_replays_the_demonstrations_in_the_in_process_textcraft(files, capsys):
    assert cli_main(["data", "verify", "env=textcraft", f"data.val_files={files[0]}"]) == 0
    assert "textcraft: 3/3 demonstrations succeed (success rate 1.000)" in capsys.readouterr().out
    assert cli_main(["data", "verify", "env=textcraft", f"data.val_files={files[1]}"]) == 1
    out = capsys.readouterr().out
    assert "3/4 demonstrations succeed (success rate 0.750)" in out
    assert "row 3 (textcraft_810): no success after all 1 actions" in out


@pytest.mark.slow
def test_training_from_the_file_warms_up_on_its_conversations(files, tmp_path, ray_local, command_here):
    # The command's function (cli.main), in this process on the tests' shared Ray.
    run_dir = tmp_path / "run"
    proc = command_here(["train", "env=textcraft", "template=agentgym", f"data.train_files={files[0]}",
                         f"data.val_files={files[0]}", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
                         "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
                         "model.tiny.vocab_size=400", "data.train_batch_size=3", "algorithm.n=2", "env.max_turns=4",
                         "rollout.max_new_tokens=8", "warmup.steps=2", "warmup.batch_size=4", "warmup.validate=false",
                         "trainer.total_steps=1", "trainer.val_before_train=false", "trainer.progress=false",
                         "trainer.loggers=[]", "trainer.num_cpus=2", "trainer.save_at_end=false",
                         f"trainer.run_dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, *rest = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert first["step"] == 0 and first["warmup/from_data"] == 3.0 and first["warmup/demonstrations"] == 3.0
    assert rest[-1]["step"] == 1 and "val/success_rate" in rest[-1]


def test_a_reply_with_several_action_markers_demonstrates_its_last_action():
    from openmanus_rl_core.data.openmanus_layout import conversation_demonstration

    turns = [{"from": "human", "loss": None, "value": "instruction"}, {"from": "gpt", "loss": False, "value": "OK"},
             {"from": "human", "loss": None, "value": "Goal: craft a stick."},
             {"from": "gpt", "loss": True,
              "value": "Thought: the format is `Action: <command>`, e.g.\nAction: look\nbut I need planks.\n"
                       "Action: get 2 oak planks\n"},
             {"from": "human", "loss": None, "value": "Got 2 oak planks"},
             {"from": "gpt", "loss": True, "value": "Thought: now craft. Action: wrong\nAction:\n craft 4 stick using 2 oak planks"}]
    demo = conversation_demonstration(turns)
    assert demo == {"observation": "Goal: craft a stick.",
                    "steps": [["get 2 oak planks", "Got 2 oak planks"], ["craft 4 stick using 2 oak planks", ""]]}
