"""The dataset env: rows in, prompts out (never the ground truth), one turn, errors that name the file/column/row,
task files that carry the ground truth, and the ground truth reaching the reward components through the rollout."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from openmanus_rl_core.commands.data import make as make_data
from openmanus_rl_core.data.tasks import DataError, load_tasks
from openmanus_rl_core.protocols import Generation, OracleEnv, ParsedAction, Trajectory, Turn
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.testing import check_env, check_oracle
from openmanus_rl_env_dataset import DEFAULT_INSTRUCTION, DatasetEnv, arithmetic_rows, hooks, make_arithmetic

CONFIG = Path(hooks.__file__).parent / "configs" / "env" / "dataset.yaml"


def write(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# -------------------------------------------------------------------------------------------- arithmetic
def test_arithmetic_rows_are_correct_and_stable():
    rows = arithmetic_rows(300, seed=0)
    assert len(rows) == 300
    for r in rows:
        q = r["prompt"][0]["content"]
        assert q.startswith("What is ") and q.endswith("?")
        a, op, b = q[len("What is "):-1].split()
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert r["reward_model"]["ground_truth"] == str(expected) and expected >= 0
        assert r["data_source"] == "arithmetic"
    assert {r["prompt"][0]["content"].split()[3] for r in rows} == {"+", "-", "*"}
    # row i depends on (seed, i) only: a shorter set is a prefix; another seed differs
    def qa(rs):
        return [(r["prompt"], r["reward_model"]) for r in rs]

    assert qa(arithmetic_rows(10, seed=0)) == qa(rows[:10])
    assert qa(arithmetic_rows(10, seed=1)) != qa(rows[:10])
    assert [r["extra_info"]["split"] for r in rows].count("val") == 60


# ----------------------------------------------------------------------------------------------- contract
def test_registered_built_from_its_config_and_an_oracle_env():
    cfg = yaml.safe_load(CONFIG.read_text())
    assert cfg["name"] == "dataset" and cfg["max_turns"] == 1
    env = registry("env").build("dataset", **cfg["kwargs"])
    assert isinstance(env, DatasetEnv) and isinstance(env, OracleEnv)
    assert env.num_tasks == 400 == cfg["train_tasks"] + cfg["val_tasks"]
    assert env.instruction == DEFAULT_INSTRUCTION


def test_conformance_kit():
    check_env(DatasetEnv, task_ids=[0, 1, 399, None], actions=["42", "I think 7"])
    check_oracle(DatasetEnv, task_ids=list(range(20)), max_steps=1)


def test_one_turn_prompt_without_ground_truth_and_oracle():
    env = DatasetEnv()
    first = env.reset(task_id=0, seed=5)
    question = arithmetic_rows(1)[0]["prompt"][0]["content"]
    truth = arithmetic_rows(1)[0]["reward_model"]["ground_truth"]
    assert first == question and truth not in first
    assert env.oracle_action() == truth
    r = env.step("whatever")
    assert r.done and r.reward == 0.0
    assert truth not in r.observation
    assert r.info == {"ground_truth": truth, "data_source": "arithmetic", "row": 0, "success": False}
    env.reset(task_id=0)
    assert env.step(f" {truth} ").info["success"] is True  # success for the metrics; the reward stays 0
    again = env.step("more")  # after the end: answered, not raised
    assert again.done and again.reward == 0.0 and again.info["invalid"] is True
    # a seeded random row when task_id is None, deterministic
    assert env.reset(None, seed=3) == env.reset(None, seed=3)


def test_reads_the_common_verl_layout_and_several_files(tmp_path):
    a = make_arithmetic(tmp_path / "arith.parquet", n=12, seed=4)
    schema = pq.read_schema(a)
    assert pa.types.is_list(schema.field("prompt").type) and pa.types.is_struct(schema.field("reward_model").type)
    b = write(tmp_path / "qa.parquet", [
        {"prompt": "Capital of France?", "ground_truth": "Paris", "data_source": "geo"},
        {"prompt": "Capital of Italy?", "ground_truth": "Rome", "data_source": "geo"},
    ])
    env = DatasetEnv(path=[str(a), str(b)])
    assert env.num_tasks == 14
    rows = arithmetic_rows(12, seed=4)
    assert env.reset(3) == rows[3]["prompt"][0]["content"]
    assert env.oracle_action() == rows[3]["reward_model"]["ground_truth"]
    assert env.reset(13) == "Capital of Italy?" and env.oracle_action() == "Rome"
    assert env.step("Rome").info["data_source"] == "geo"
    assert env.task_fields(12) == {"prompt": "Capital of France?", "ground_truth": "Paris", "data_source": "geo"}
    assert env.task_fields(0)["ground_truth"] == rows[0]["reward_model"]["ground_truth"]


def test_in_memory_rows_chat_system_message_becomes_the_instruction():
    env = DatasetEnv(rows=[
        {"prompt": [{"role": "system", "content": "You are a calculator."},
                    {"role": "user", "content": "2+2?"}], "ground_truth": 4},
        {"prompt": "Say hi", "reward_model": {"ground_truth": ["hi", "hello"]}},
        {"prompt": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
                    {"role": "user", "content": "2+3?"}], "ground_truth": "5"},
    ], instruction="Be brief.")
    assert env.instruction == "Be brief."
    assert env.reset(0) == "2+2?" and env.instruction == "You are a calculator."
    assert env.oracle_action() == "4"  # a numeric ground truth as text
    assert env.reset(1) == "Say hi" and env.instruction == "Be brief." and env.oracle_action() == "hi"
    assert env.step("Hello!").info["success"] is True  # any reference, normalised
    env.reset(0)
    assert env.step("4.").info["success"] is True
    strict = DatasetEnv(rows=[{"prompt": "q", "ground_truth": "Paris"}], success_match="exact")
    strict.reset(0)
    assert strict.step("paris").info["success"] is False
    silent = DatasetEnv(rows=[{"prompt": "q", "ground_truth": "Paris"}], success_match=None)
    silent.reset(0)
    assert "success" not in silent.step("Paris").info
    assert env.reset(2) == "User: 1+1?\n\nAssistant: 2\n\nUser: 2+3?"
    assert env.task_fields(1)["ground_truth"] == '["hi", "hello"]'


# ------------------------------------------------------------------------------------------------ bad data
def test_bad_files_name_file_column_and_row(tmp_path):
    missing_col = write(tmp_path / "nogt.parquet", [{"prompt": "q"}])
    with pytest.raises(DataError, match=r"nogt\.parquet.*missing column 'ground_truth'"):
        DatasetEnv(path=missing_col)
    DatasetEnv(path=missing_col, require_ground_truth=False)  # fine when no scorer needs one

    no_prompt = write(tmp_path / "noprompt.parquet", [{"question": "q", "ground_truth": "a"}])
    with pytest.raises(DataError, match=r"noprompt\.parquet.*missing column 'prompt'"):
        DatasetEnv(path=no_prompt)

    null_gt = write(tmp_path / "nullgt.parquet", [
        {"prompt": "q0", "reward_model": {"ground_truth": "a"}},
        {"prompt": "q1", "reward_model": {"ground_truth": None}},
    ])
    with pytest.raises(DataError, match=r"nullgt\.parquet: row 1: no ground truth"):
        DatasetEnv(path=null_gt)

    bad_type = write(tmp_path / "badtype.parquet", [{"prompt": 7, "ground_truth": "a"}])
    with pytest.raises(DataError, match=r"badtype\.parquet.*'prompt'.*int64"):
        DatasetEnv(path=bad_type)

    empty_msg = write(tmp_path / "chat.parquet", [
        {"prompt": [{"role": "user", "content": "fine"}], "ground_truth": "a"},
        {"prompt": [{"role": "system", "content": "only a system message"}], "ground_truth": "b"},
    ])
    with pytest.raises(DataError, match=r"chat\.parquet: row 1: column 'prompt' has no user message"):
        DatasetEnv(path=empty_msg)

    with pytest.raises(DataError, match=r"nowhere\.parquet: no such dataset file"):
        DatasetEnv(path=tmp_path / "nowhere.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable parquet file"):
        DatasetEnv(path=tmp_path / "junk.parquet")


def test_bad_in_memory_rows_and_task_ids():
    with pytest.raises(DataError, match=r"rows\[1\]: column 'prompt' message 0"):
        DatasetEnv(rows=[{"prompt": "q", "ground_truth": "a"}, {"prompt": [{"role": "user"}], "ground_truth": "b"}])
    with pytest.raises(DataError, match=r"rows\[0\]: no ground truth"):
        DatasetEnv(rows=[{"prompt": "q"}])
    with pytest.raises(DataError, match=r"rows\[0\]: column 'prompt' is empty"):
        DatasetEnv(rows=[{"prompt": "  ", "ground_truth": "a"}])
    with pytest.raises(ValueError, match="either path"):
        DatasetEnv(path="x.parquet", rows=[])
    env = DatasetEnv(arithmetic_size=5)
    with pytest.raises(ValueError, match=r"task_id 5 is out of range.*5 rows"):
        env.reset(5)
    with pytest.raises(ValueError, match="task_id must be an int"):
        env.reset("3")


def test_file_rows_are_cached_until_the_file_changes(tmp_path):
    p = write(tmp_path / "d.parquet", [{"prompt": "q", "ground_truth": "a"}])
    first = DatasetEnv(path=p)
    assert DatasetEnv(path=p).rows is first.rows  # the trainer builds one env per episode: read once
    write(p, [{"prompt": "q2", "ground_truth": "b"}, {"prompt": "q3", "ground_truth": "c"}])
    assert DatasetEnv(path=p).num_tasks == 2


# ------------------------------------------------------------------------------------ task files and rewards
def _cfg(tmp_path, **env_kwargs):
    from openmanus_rl_core.config.schema import Config, DataConfig, EnvConfig

    return Config(env=EnvConfig(name="dataset", kwargs=env_kwargs, max_turns=1, train_tasks=8, val_tasks=4),
                  data=DataConfig(dir=str(tmp_path / "made"), seed=0))


def test_data_make_writes_the_ground_truth_into_the_task_files(tmp_path, capsys):
    assert make_data(_cfg(tmp_path, arithmetic_size=12)) == 0
    train = load_tasks(tmp_path / "made" / "train.parquet")
    val = load_tasks(tmp_path / "made" / "val.parquet")
    assert [t["task_id"] for t in train] == list(range(8)) and [t["task_id"] for t in val] == [8, 9, 10, 11]
    rows = arithmetic_rows(12)
    for t in train + val:
        assert t["ground_truth"] == rows[t["task_id"]]["reward_model"]["ground_truth"]
        assert t["prompt"] == rows[t["task_id"]]["prompt"][0]["content"]
        assert t["data_source"] == "arithmetic" and t["env"] == "dataset"


def test_data_make_from_a_user_file(tmp_path):
    src = make_arithmetic(tmp_path / "src.parquet", n=6, seed=9)
    cfg = _cfg(tmp_path, path=str(src))
    cfg.env.train_tasks, cfg.env.val_tasks = 4, 2
    make_data(cfg)
    val = load_tasks(tmp_path / "made" / "val.parquet")
    assert [t["ground_truth"] for t in val] == [r["reward_model"]["ground_truth"] for r in arithmetic_rows(6, 9)[4:]]


def _oracle_trajectory(env: DatasetEnv, task: dict, reply: str | None = None) -> Trajectory:
    obs = env.reset(task["task_id"], task["seed"])
    answer = env.oracle_action() if reply is None else reply
    text = f"<think>easy</think><action>{answer}</action>"
    r = env.step(answer)
    return Trajectory(task_id=task["task_id"], seed=task["seed"], group_id=0, initial_observation=obs,
                      turns=[Turn(text, ParsedAction("action", answer, True), r.observation, r.reward, r.done,
                                  r.info, (0, 5))], task=dict(task))


def test_math_reward_scores_trajectories_of_generated_tasks(tmp_path):
    make_data(_cfg(tmp_path, arithmetic_size=12))
    tasks = load_tasks(tmp_path / "made" / "train.parquet")
    env = DatasetEnv(arithmetic_size=12)
    trajs = [_oracle_trajectory(env, tasks[0]), _oracle_trajectory(env, tasks[1], reply="-1")]
    composer = RewardComposer.from_config({"answer": {"name": "math_answer", "weight": 1.0}})
    breakdowns, metrics = composer.compose_batch(trajs)
    assert [b.total for b in breakdowns] == [1.0, 0.0]
    assert metrics["reward/answer/errors"] == 0.0


def test_hook_fills_a_missing_ground_truth_from_the_step_info():
    env = DatasetEnv(arithmetic_size=4)
    bare = _oracle_trajectory(env, {"task_id": 2, "seed": 0})   # a hand-written task file: no ground truth
    kept = _oracle_trajectory(env, {"task_id": 3, "seed": 0, "ground_truth": "mine"})
    hooks.openmanus_rl_process_trajectories(trajectories=[bare, kept, Trajectory(0, 0, 0, "x")], step=1)
    assert bare.task["ground_truth"] == arithmetic_rows(4)[2]["reward_model"]["ground_truth"]
    assert bare.task["data_source"] == "arithmetic"
    assert kept.task["ground_truth"] == "mine"


def test_ground_truth_reaches_trajectory_task_through_the_agent_loop(tmp_path):
    """The rollout keeps each task row in Trajectory.task, so FunctionReward scorers see its ground truth."""
    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.rollout import AgentLoop, RolloutConfig

    make_data(_cfg(tmp_path, arithmetic_size=12))
    tasks = load_tasks(tmp_path / "made" / "train.parquet")[:3]
    rows = arithmetic_rows(12)
    tok = build_tokenizer([r["prompt"][0]["content"] for r in rows] + ["<action>", "</action>"], vocab_size=300)

    class Echo:
        """Replies with task 0's correct answer to every prompt."""

        def generate(self, prompts, params):
            ids = tok.encode(f"<action>{tasks[0]['ground_truth']}</action>") + [tok.eos_token_id]
            return [Generation(ids, [-0.1] * len(ids), tok.decode(ids, skip_special_tokens=True), "stop")
                    for _ in prompts]

        def update_weights(self, sd):
            pass

    template = registry("template").build("react")
    loop = AgentLoop(Echo(), tok, template, lambda: DatasetEnv(arithmetic_size=12), RolloutConfig(max_turns=1))
    episodes = loop.run(tasks)
    trajs = [e.trajectory for e in episodes]
    for t, task in zip(trajs, tasks):
        assert t.task["ground_truth"] == task["ground_truth"] == rows[task["task_id"]]["reward_model"]["ground_truth"]
        assert t.initial_observation == task["prompt"]
    composer = RewardComposer.from_config({"answer": {"name": "math_answer", "weight": 1.0}})
    breakdowns, _ = composer.compose_batch(trajs)
    expected = [1.0 if task["ground_truth"] == tasks[0]["ground_truth"] else 0.0 for task in tasks]
    assert [b.total for b in breakdowns] == expected and expected[0] == 1.0
