"""Task files, the sampler, `data make` and `ensure_task_files` (hand-computed expectations)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openmanus_rl_core.data import generation as task_generation
from openmanus_rl_core.commands.data import make as make_data
from openmanus_rl_core.data.tasks import DataError, load_tasks, write_tasks
from openmanus_rl_core.data.sampler import TaskSampler


def _write(path, columns: dict) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


# ------------------------------------------------------------------------------------------ loading
def test_load_documented_columns(tmp_path):
    p = _write(tmp_path / "t.parquet", {
        "env": ["word_copy", "word_copy"], "task_id": pa.array([3, 4], pa.int64()), "seed": pa.array([10, 11], pa.int64()),
        "split": ["train", "train"], "prompt": ["say a", None], "ground_truth": ["a", "b"],
        "data_source": ["unit", "unit"], "extra": ['{"k": 1}', None],
    })
    tasks = load_tasks(p)
    assert tasks == [
        {"env": "word_copy", "task_id": 3, "seed": 10, "split": "train", "prompt": "say a", "ground_truth": "a",
         "data_source": "unit", "source": None, "extra": {"k": 1}},
        {"env": "word_copy", "task_id": 4, "seed": 11, "split": "train", "prompt": None, "ground_truth": "b",
         "data_source": "unit", "source": None, "extra": {}},
    ]


def test_load_fills_absent_optional_columns_and_passes_unknown_ones(tmp_path):
    p = _write(tmp_path / "t.parquet", {"task_id": pa.array([1], pa.int32()), "seed": [2], "difficulty": [0.5]})
    (task,) = load_tasks(p)
    assert task == {"env": None, "task_id": 1, "seed": 2, "split": None, "prompt": None, "ground_truth": None,
                    "data_source": None, "source": None, "extra": {}, "difficulty": 0.5}
    assert type(task["task_id"]) is int


def test_missing_column_names_file_column_and_type(tmp_path):
    p = _write(tmp_path / "nosed.parquet", {"task_id": [0, 1]})
    with pytest.raises(DataError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert "nosed.parquet" in msg and "'seed'" in msg and "int64" in msg and "missing" in msg


def test_mistyped_column_names_file_column_and_types(tmp_path):
    p = _write(tmp_path / "strid.parquet", {"task_id": ["0", "1"], "seed": [0, 1]})
    with pytest.raises(DataError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert "strid.parquet" in msg and "'task_id'" in msg and "string" in msg and "expected int64" in msg


def test_null_task_id_names_the_row(tmp_path):
    p = _write(tmp_path / "nul.parquet", {"task_id": pa.array([0, 1, None, 3], pa.int64()), "seed": [0, 0, 0, 0]})
    with pytest.raises(DataError, match=r"nul\.parquet: column 'task_id' row 2: null value, expected int64"):
        load_tasks(p)


def test_non_integer_task_id_names_the_row(tmp_path):
    # pandas writes an int column with gaps as float: whole numbers pass, 1.5 in row 1 does not
    p = _write(tmp_path / "flt.parquet", {"task_id": [0.0, 1.5, 2.0], "seed": [0, 0, 0]})
    with pytest.raises(DataError, match=r"flt\.parquet: column 'task_id' row 1: 1\.5 is not an integer"):
        load_tasks(p)
    ok = _write(tmp_path / "whole.parquet", {"task_id": [0.0, 7.0], "seed": [1, 2]})
    assert [t["task_id"] for t in load_tasks(ok)] == [0, 7]


def test_bad_extra_json_names_the_row(tmp_path):
    p = _write(tmp_path / "x.parquet", {"task_id": [0, 1], "seed": [0, 0], "extra": ['{"a": 1}', "{not json"]})
    with pytest.raises(DataError, match=r"x\.parquet: column 'extra' row 1: not valid JSON"):
        load_tasks(p)


def test_mistyped_optional_string_column(tmp_path):
    p = _write(tmp_path / "e.parquet", {"task_id": [0], "seed": [0], "env": [5]})
    with pytest.raises(DataError, match=r"e\.parquet: column 'env' has type int64, expected string"):
        load_tasks(p)


def test_missing_file_and_garbage_file(tmp_path):
    with pytest.raises(DataError, match="no such task file"):
        load_tasks(tmp_path / "absent.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: not a readable parquet file"):
        load_tasks(bad)


def test_verl_reward_model_struct_layout(tmp_path):
    p = _write(tmp_path / "verl.parquet", {
        "data_source": ["gsm8k", "gsm8k"],
        "prompt": [[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]],
        "reward_model": [{"style": "rule", "ground_truth": "2"}, {"style": "rule", "ground_truth": "4"}],
        "extra_info": [{"index": 0, "split": "train"}, {"index": 1, "split": "train"}],
    })
    tasks = load_tasks(p, required=("ground_truth",))
    assert [t["ground_truth"] for t in tasks] == ["2", "4"]
    assert tasks[1]["prompt"] == [{"role": "user", "content": "2+2?"}]
    assert tasks[0]["extra"] == {"index": 0, "split": "train"}
    assert tasks[0]["task_id"] is None and tasks[0]["data_source"] == "gsm8k"
    with pytest.raises(DataError, match="missing column 'task_id'"):
        load_tasks(p)  # the default still needs task_id and seed
    # a null reward_model.ground_truth reads as None (the dataset env reports it with its own message)
    q = _write(tmp_path / "gap.parquet", {"reward_model": [{"ground_truth": "1"}, {"ground_truth": None}]})
    assert [t["ground_truth"] for t in load_tasks(q, required=("ground_truth",))] == ["1", None]


def test_write_then_load_round_trip_and_atomic(tmp_path):
    tasks = [{"env": "e", "task_id": 5, "seed": 9, "split": "val", "extra": {"x": [1, 2]}},
             {"env": "e", "task_id": 6, "seed": 10, "split": "val", "extra": {}}]
    path = write_tasks(tmp_path / "sub" / "val.parquet", tasks)
    assert sorted(p.name for p in path.parent.iterdir()) == ["val.parquet"]  # no temp file left behind
    schema = pq.read_schema(path)
    assert schema.field("task_id").type == pa.int64() and schema.field("extra").type == pa.string()
    back = load_tasks(path)
    assert [(t["task_id"], t["seed"], t["extra"]) for t in back] == [(5, 9, {"x": [1, 2]}), (6, 10, {})]
    with pytest.raises(DataError, match=r"column 'task_id' as int64: task 1 has 'seven'"):
        write_tasks(tmp_path / "bad.parquet", [{"task_id": 1, "seed": 0}, {"task_id": "seven", "seed": 0}])
    assert not (tmp_path / "bad.parquet").exists()


def test_load_several_files_in_order(tmp_path):
    a = write_tasks(tmp_path / "a.parquet", [{"task_id": 1, "seed": 0}])
    b = write_tasks(tmp_path / "b.parquet", [{"task_id": 2, "seed": 0}, {"task_id": 3, "seed": 0}])
    assert [t["task_id"] for t in load_tasks([a, b])] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ sampler
def _tasks(n):
    return [{"task_id": i, "seed": 0} for i in range(n)]


def _ids(batch):
    return [t["task_id"] for t in batch]


def test_sampler_without_shuffle_wraps_across_epochs():
    s = TaskSampler(_tasks(5), batch_size=2, seed=0, shuffle=False)
    assert [_ids(s.next_batch()) for _ in range(4)] == [[0, 1], [2, 3], [4, 0], [1, 2]]
    assert (s.epoch, s.position) == (1, 3)
    assert len(s) == 3
    big = TaskSampler(_tasks(3), batch_size=7, shuffle=False)
    assert _ids(big.next_batch()) == [0, 1, 2, 0, 1, 2, 0]


def test_sampler_shuffle_is_the_documented_permutation():
    s = TaskSampler(_tasks(6), batch_size=3, seed=7)
    e0 = np.random.default_rng([7, 0]).permutation(6).tolist()
    e1 = np.random.default_rng([7, 1]).permutation(6).tolist()
    got = [_ids(s.next_batch()) for _ in range(4)]
    assert got == [e0[:3], e0[3:], e1[:3], e1[3:]]
    assert e0 != e1  # the order changes between epochs
    assert sorted(e0) == list(range(6))


def test_sampler_resume_gives_the_same_next_batches():
    ref = TaskSampler(_tasks(7), batch_size=3, seed=11)
    for _ in range(5):  # 15 tasks drawn: epoch 2, position 1
        ref.next_batch()
    state = ref.state_dict()
    assert state == {"epoch": 2, "position": 1, "seed": 11, "shuffle": True, "num_tasks": 7}
    expected = [_ids(ref.next_batch()) for _ in range(6)]

    resumed = TaskSampler(_tasks(7), batch_size=3, seed=11)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [_ids(resumed.next_batch()) for _ in range(6)] == expected

    with pytest.raises(DataError, match="saved with 7 tasks but this run has 8"):
        TaskSampler(_tasks(8), batch_size=3, seed=11).load_state_dict(state)
    with pytest.raises(DataError, match="seed=11"):
        TaskSampler(_tasks(7), batch_size=3, seed=12).load_state_dict(state)


def test_sampler_batches_are_copies():
    tasks = _tasks(2)
    s = TaskSampler(tasks, batch_size=1, shuffle=False)
    s.next_batch()[0]["task_id"] = 99
    assert tasks[0]["task_id"] == 0


def test_sampler_rejects_empty_and_bad_batch_size():
    with pytest.raises(DataError, match="no tasks"):
        TaskSampler([], batch_size=1)
    with pytest.raises(DataError, match="batch_size=0"):
        TaskSampler(_tasks(1), batch_size=0)


# ------------------------------------------------------------------------------------ generation
def _seed(split_code, i, data_seed=0):
    return int(np.random.SeedSequence([data_seed, split_code, i]).generate_state(1)[0]) & 0x7FFFFFFF


def test_generate_disjoint_ids_when_the_env_has_enough_tasks():
    train, val = task_generation.generate_tasks("e", 3, 2, seed=0, num_tasks=10)
    assert [t["task_id"] for t in train] == [0, 1, 2] and [t["task_id"] for t in val] == [3, 4]
    assert [t["seed"] for t in train] == [_seed(0, 0), _seed(0, 1), _seed(0, 2)]
    assert [t["seed"] for t in val] == [_seed(1, 0), _seed(1, 1)]
    assert {t["split"] for t in train} == {"train"} and {t["env"] for t in val} == {"e"}


def test_generate_wraps_ids_and_separates_by_seed_when_the_env_is_small():
    train, val = task_generation.generate_tasks("e", 5, 3, seed=1, num_tasks=4)
    assert [t["task_id"] for t in train] == [0, 1, 2, 3, 0] and [t["task_id"] for t in val] == [0, 1, 2]
    assert not {(t["task_id"], t["seed"]) for t in train} & {(t["task_id"], t["seed"]) for t in val}


def _cfg(tmp_path, **env):
    from openmanus_rl_core.config.schema import Config, DataConfig, EnvConfig

    return Config(env=EnvConfig(**{"name": "unit_env", "max_turns": 1, "num_tasks": 100, **env}),
                  data=DataConfig(dir=str(tmp_path / "made"), seed=0))


def test_make_writes_both_splits_and_prints_paths(tmp_path, capsys):
    cfg = _cfg(tmp_path, train_tasks=4, val_tasks=2)
    assert make_data(cfg) == 0
    out = capsys.readouterr().out
    train = load_tasks(tmp_path / "made" / "train.parquet")
    val = load_tasks(tmp_path / "made" / "val.parquet")
    assert [t["task_id"] for t in train] == [0, 1, 2, 3] and [t["task_id"] for t in val] == [4, 5]
    assert str(tmp_path / "made" / "train.parquet") in out and "(4 tasks)" in out and "(2 tasks)" in out


def test_make_falls_back_to_the_schema_task_counts(tmp_path):
    from openmanus_rl_core.config.schema import EnvConfig

    make_data(_cfg(tmp_path))
    assert len(load_tasks(tmp_path / "made" / "train.parquet")) == EnvConfig.train_tasks == 256
    assert len(load_tasks(tmp_path / "made" / "val.parquet")) == EnvConfig.val_tasks == 64


def test_data_config_defaults_resolve(tmp_path, monkeypatch):
    from openmanus_rl_core.config.loading import compose

    monkeypatch.delenv("OPENMANUS_RL_DATA", raising=False)
    cfg = compose(["seed=4", "env=word_copy"])
    assert cfg.data.dir == "outputs/data/word_copy"  # with every other output, under trainer.output_dir
    assert compose(["env=word_copy", "trainer.output_dir=/runs"]).data.dir == "/runs/data/word_copy"
    assert cfg.data.seed == 4 and cfg.data.train_files is None and cfg.data.shuffle is True
    monkeypatch.setenv("OPENMANUS_RL_DATA", "/data")
    assert cfg.data.dir == "/data/word_copy"


def test_ensure_task_files_generates_only_what_is_missing(tmp_path):
    cfg = _cfg(tmp_path, train_tasks=3, val_tasks=1)
    train, val = task_generation.ensure_task_files(cfg, tmp_path / "run" / "data")
    assert train == str(tmp_path / "run" / "data" / "train.parquet") and len(load_tasks(train)) == 3
    assert val == str(tmp_path / "run" / "data" / "val.parquet") and len(load_tasks(val)) == 1

    mine = write_tasks(tmp_path / "mine.parquet", [{"task_id": 42, "seed": 0}])
    cfg.data.val_files = str(mine)
    train2, val2 = task_generation.ensure_task_files(cfg, tmp_path / "run2")
    assert val2 == str(mine) and not (tmp_path / "run2" / "val.parquet").exists()
    assert (tmp_path / "run2" / "train.parquet").exists()

    cfg.data.train_files = [str(tmp_path / "nope.parquet")]
    with pytest.raises(DataError, match=r"data.train_files: .*nope\.parquet: no such file"):
        task_generation.ensure_task_files(cfg, tmp_path / "run3")


def test_make_uses_the_env_num_tasks_from_the_registry(tmp_path, monkeypatch):
    class Small:
        def __init__(self, size=2):
            self.num_tasks = size

        def close(self):
            pass

    class FakeRegistry:
        def get(self, name):
            assert name == "unit_env"
            return Small

        def build(self, name, **kwargs):
            return self.get(name)(**kwargs)

    import openmanus_rl_core.plugin.registry as reg

    monkeypatch.setattr(reg, "registry", lambda kind: FakeRegistry())
    cfg = _cfg(tmp_path, train_tasks=3, val_tasks=2, kwargs={"size": 3}, num_tasks=None)
    make_data(cfg)
    assert [t["task_id"] for t in load_tasks(tmp_path / "made" / "train.parquet")] == [0, 1, 2]
    assert [t["task_id"] for t in load_tasks(tmp_path / "made" / "val.parquet")] == [0, 1]  # 3 + 2 > 3: wrapped


def _damage_text(path, text: bytes) -> None:
    """Overwrite one byte inside ``text`` in the file with 0xFF (never valid UTF-8): a damaged string page."""
    raw = bytearray(path.read_bytes())
    raw[raw.index(text) + 7] = 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("column", ["prompt", "ground_truth", "notes"])
def test_a_damaged_string_page_names_file_column_and_row(tmp_path, column):
    """Written plain and uncompressed, the strings sit in the file as they are; one damaged byte makes row 2 of the
    column invalid UTF-8, which pyarrow reads without complaint and Python cannot decode."""
    path = tmp_path / "tasks.parquet"
    table = pa.table({"task_id": [0, 1, 2, 3], "seed": [0, 0, 0, 0],
                      column: [f"{column} value of row {i}" for i in range(4)]})
    pq.write_table(table, path, compression="NONE", use_dictionary=False)
    _damage_text(path, f"{column} value of row 2".encode())
    with pytest.raises(DataError) as err:
        load_tasks(path)
    assert str(err.value) == (f"{path}: column {column!r} row 2: text that is not valid UTF-8 (invalid start byte); "
                              f"the file is damaged or was written in another encoding")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_an_empty_validation_set_is_an_error_naming_the_file(tmp_path, command_here):
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    write_tasks(train, [{"task_id": i, "seed": i} for i in range(4)])
    pq.write_table(pa.table({"task_id": pa.array([], pa.int64()), "seed": pa.array([], pa.int64())}), val)
    assert load_tasks(val) == []
    out = command_here(["train", "env=key_door", f"data.train_files={train}", f"data.val_files={val}",
                        f"trainer.run_dir={tmp_path / 'run'}", "trainer.val_freq=5"])
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert (f"error: {val}: no tasks (0 rows), but the run validates (trainer.val_freq=5 "
            f"trainer.val_before_train=True trainer.val_at_end=True); give validation tasks") in out.stderr


def test_data_verify_fails_a_demonstration_whose_episode_ends_without_success(tmp_path, capsys):
    """word_copy ends after one action: the right word passes, a wrong one ends the episode without success and
    fails its row (the env said done, but not success)."""
    from openmanus_rl_core.cli import main as cli_main
    from openmanus_rl_core.plugin.registry import registry

    env = registry("env").build("word_copy")
    env.reset(task_id=0, seed=0)
    word = env.oracle_action()
    env.close()
    path = tmp_path / "demos.parquet"
    pq.write_table(pa.table({
        "task_id": pa.array([0, 0], pa.int64()), "seed": pa.array([0, 0], pa.int64()),
        "item_id": ["right", "wrong"],
        "demonstration": [{"observation": "", "steps": [[word, "Correct."]]},
                          {"observation": "", "steps": [["nope", "Wrong."]]}]}), path)
    assert cli_main(["data", "verify", "env=word_copy", f"data.val_files={path}"]) == 1
    out = capsys.readouterr().out
    assert f"word_copy: 1/2 demonstrations succeed (success rate 0.500) in {path}" in out
    assert out.endswith("failing rows (1):\n  row 1 (wrong): the episode ended at action 1 ('nope') without success: "
                        "'Wrong.'\n")
