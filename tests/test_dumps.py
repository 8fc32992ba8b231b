"""Rollout dumps (trainer.save_rollouts, run/dumps.py) and `openmanus-rl replay` (commands/replay.py): what each step
trained on is kept whole, atomically, named by the next checkpoint, and replays to the run's own weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openmanus_rl_core.batch import Batch
from openmanus_rl_core.checkpoint.store import load_checkpoint
from openmanus_rl_core.run.dumps import DumpError, dump_path, model_fingerprint, read_dump, write_dump
from kills import kill_once_written

BIN = Path(sys.executable).parent
SMALL = ["env=key_door", "trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=1", "trainer.num_workers=1",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
         "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=4", "algorithm.n=2",
         "warmup.steps=2", "rollout.max_new_tokens=8", "env.train_tasks=16", "env.val_tasks=4",
         "trainer.val_freq=0", "trainer.val_before_train=false", "trainer.val_at_end=false",
         "algorithm.entropy_coeff=0.01",  # every update moves the weights, learning signal or not
         "trainer.total_steps=5", "trainer.save_freq=5", "trainer.save_rollouts=true"]


def _batch(rows: int = 3, width: int = 5) -> Batch:
    g = torch.Generator().manual_seed(0)
    tensors = {"input_ids": torch.randint(0, 50, (rows, width), generator=g),
               "attention_mask": torch.ones(rows, width, dtype=torch.long),
               "position_ids": torch.arange(width).repeat(rows, 1),
               "responses": torch.randint(0, 50, (rows, 2), generator=g),
               "response_mask": torch.tensor([[1.0, 0.0]] * rows),
               "advantages": torch.randn(rows, 2, generator=g), "old_log_probs": torch.randn(rows, 2, generator=g),
               "versions": torch.tensor([[3, -1]] * rows), "valid": torch.tensor([True] * (rows - 1) + [False]),
               "forced": torch.tensor([[1.0, 0.0]] + [[0.0, 0.0]] * (rows - 1)),
               "choice_ids": torch.tensor([[[7, -1, -1], [-1, -1, -1]]] + [[[3, 4, 9], [-1, -1, -1]]] * (rows - 1)),
               "ref_choice_log_probs": torch.randn(rows, 2, 3, generator=g),
               "choice_values": torch.randn(rows, 2, 3, generator=g)}
    non_tensors = {"task_id": list(range(rows)), "group_ids": ["g0"] * 2 + ["g1"] * (rows - 2),
                   "uid": [f"u{i}" for i in range(rows)], "reward": [0.5] * rows, "reward_parts": [{"goal": 0.5}] * rows,
                   "termination": ["done"] * (rows - 1) + ["env_error"], "success": [True] * rows,
                   "invalid": [0, 1, 0][:rows], "data_source": ["key_door"] * rows}
    return Batch(tensors=tensors, non_tensors=non_tensors)


def test_a_dump_reads_back_as_the_batch_the_update_read(tmp_path):
    batch = _batch()
    path, sha = write_dump(tmp_path, 7, batch, "f" * 64)
    assert path == dump_path(tmp_path, 7) == tmp_path / "step_000007.parquet" and len(sha) == 64
    assert [p.name for p in tmp_path.iterdir()] == ["step_000007.parquet"]  # no temporary file left
    back = read_dump(path, "f" * 64)
    assert back.tensors.keys() == batch.tensors.keys()
    for name, t in batch.tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert list(back.non_tensors["group_id"]) == ["g0", "g0", "g1"] and back.non_tensors["termination"][-1] == "env_error"
    import pyarrow.parquet as pq

    table = pq.read_table(path).to_pydict()
    assert table["sample"] == [0, 1, 0] and table["turn"] == [-1, -1, -1] and table["env_error"] == [False, False, True]
    assert table["invalid"] == [0, 1, 0] and json.loads(table["reward_parts"][0]) == {"goal": 0.5}


def test_a_truncated_or_foreign_dump_is_refused_naming_the_file(tmp_path):
    path, _ = write_dump(tmp_path, 1, _batch(), "a" * 64)
    with pytest.raises(DumpError, match=rf"^{path}: written for another model or tokenizer"):
        read_dump(path, "b" * 64)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DumpError, match=rf"^{path}: not a readable rollout dump"):
        read_dump(path)


def test_the_fingerprint_tells_models_and_tokenizers_apart(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"hidden_size": 32}')
    (tmp_path / "a" / "tokenizer.json").write_text('{"vocab": 1}')
    first = model_fingerprint(tmp_path / "a")
    (tmp_path / "a" / "tokenizer.json").write_text('{"vocab": 2}')
    assert model_fingerprint(tmp_path / "a") != first


def test_a_step_written_again_with_nothing_dropped_loses_its_old_dropped_file_and_manifest_entry(tmp_path):
    """A killed run's attempt at step 3 left a group out; the resumed run trains step 3 with nothing left out: the
    old dropped_000003.jsonl goes, and the next checkpoint's manifest no longer names it."""
    from openmanus_rl_core.run.dumps import RolloutDumps

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    dumps = RolloutDumps(tmp_path / "run", tmp_path / "model")
    dumps.write(3, _batch(), dropped=[{"task_id": 9, "group_id": "g9", "samples": 2, "reason": "no_spread"}])
    folder = tmp_path / "run" / "rollouts"
    assert sorted(p.name for p in folder.iterdir()) == ["dropped_000003.jsonl", "step_000003.parquet"]
    assert sorted(dumps.manifest(3)) == ["dropped_000003.jsonl", "step_000003.parquet"]
    dumps.write(3, _batch(), dropped=[])  # the same run writing the step again
    assert sorted(p.name for p in folder.iterdir()) == ["step_000003.parquet"]
    assert sorted(dumps.manifest(3)) == ["step_000003.parquet"]
    # A resumed run (a new writer, from checkpoint 2) finds the killed attempt's files on disk.
    dumps.write(3, _batch(), dropped=[{"task_id": 9, "group_id": "g9", "samples": 2, "reason": "surplus"}])
    resumed = RolloutDumps(tmp_path / "run", tmp_path / "model")
    assert sorted(resumed.manifest(2)) == []
    resumed.write(3, _batch(), dropped=[])
    assert sorted(p.name for p in folder.iterdir()) == ["step_000003.parquet"]
    assert sorted(resumed.manifest(3)) == ["step_000003.parquet"]


# ----------------------------------------------------------------------------------------- a run, replayed
@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory, cli_env, ray_local) -> Path:
    """A PPO run with its critic, 5 steps, dumping every batch, checkpoints at steps 0, 2, 4 and 5: killed with
    kill -9 once step 3's dump is written (a command of its own), then resumed (from step 2: step 3 is trained and
    dumped again) by the same command's function, ``cli.main``, in this process on the tests' shared Ray."""
    from openmanus_rl_core.cli import main

    run = tmp_path_factory.mktemp("dumps") / "run"
    cmd = [str(BIN / "openmanus-rl"), "train", *[o for o in SMALL if not o.startswith("trainer.save_freq=")],
           "trainer.save_freq=2", "trainer.max_checkpoints=null", "algorithm=ppo", f"trainer.run_dir={run}"]
    kill_once_written(cmd, run / "rollouts" / "step_000003.parquet", cli_env)
    assert main([*cmd[1:], "trainer.resume=auto"]) == 0
    return run


@pytest.mark.slow
def test_across_a_kill_each_task_is_trained_n_times_in_the_samplers_order_none_lost_none_twice(ppo_run):
    """The dumps of steps 1..5 hold exactly the first 20 tasks of the sampler's order (an epoch of 16, then 4 of the
    next), each n=2 times, in order: the steps the kill cut short were trained again from the checkpoint, none twice."""
    import pyarrow.parquet as pq

    from openmanus_rl_core.data.sampler import TaskSampler
    from openmanus_rl_core.data.tasks import load_tasks

    tasks = load_tasks(ppo_run / "data" / "train.parquet")  # 16 tasks: steps 1-4 are epoch 0, step 5 opens epoch 1
    sampler = TaskSampler(tasks, 4, seed=0)
    order = [tasks[i]["task_id"] for epoch in (0, 1) for i in sampler.order(epoch)]
    trained = [t for k in range(1, 6) for t in pq.read_table(ppo_run / "rollouts" / f"step_00000{k}.parquet")
               .column("task_id").to_pylist()]
    assert trained == [t for t in order[:20] for _ in range(2)]
    assert not list((ppo_run / "rollouts").glob("dropped_*")) and not list((ppo_run / "rollouts").glob(".*tmp*"))


@pytest.mark.slow
def test_the_docs_count_each_row_drawn_and_trained_once_from_the_dumps_alone(ppo_run, capsys):
    """docs/rollout-records.md's block, run as written on the killed and resumed run: each draw names its task
    row (its index in the task file, its seed), and over 5 steps of 4 tasks the 16 rows are each drawn once, then
    the second epoch's first 4 again."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "rollout-records.md").read_text()
    section = page[page.index("## Counting what was trained"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(block.replace('run = "runs/a"', f"run = {str(ppo_run)!r}"), "rollout-records.md", "exec"), scope)
    assert capsys.readouterr().out == "20 draws trained, 0 left out, over 16 of 16 rows, each drawn 1 or 2 times\n"
    assert sorted(scope["drawn"].values()) == [1] * 12 + [2] * 4
    # the rows drawn twice are the first 4 of the sampler's second epoch, by row, not by task id
    from openmanus_rl_core.data.sampler import TaskSampler
    from openmanus_rl_core.data.tasks import load_tasks

    tasks = load_tasks(ppo_run / "data" / "train.parquet")
    second = TaskSampler(tasks, 4, seed=0).order(1)[:4]
    assert sorted(r for r, k in scope["drawn"].items() if k == 2) == sorted(second)


@pytest.mark.slow
def test_every_step_is_dumped_named_by_the_checkpoint_and_replays_to_the_runs_weights(ppo_run, command_here):
    dumps = sorted(p.name for p in (ppo_run / "rollouts").iterdir())
    assert dumps == [f"step_00000{k}.parquet" for k in range(1, 6)]
    listed = json.loads((ppo_run / "checkpoints" / "step_000005" / "meta.json").read_text())["meta"]["rollouts"]
    assert sorted(listed) == dumps
    from openmanus_rl_core.run.dumps import _sha256

    assert all(listed[name] == _sha256(ppo_run / "rollouts" / name) for name in dumps)
    batch = read_dump(ppo_run / "rollouts" / "step_000003.parquet")
    assert len(batch) == 8 and {"values", "returns", "advantages", "old_log_probs", "versions"} <= set(batch.tensors)
    assert set(batch["versions"][batch["response_mask"] > 0].tolist()) == {2}  # generated by the weights of step 2

    start = load_checkpoint(ppo_run / "checkpoints" / "step_000000", keys=["model", "critic"])
    end = load_checkpoint(ppo_run / "checkpoints" / "step_000005", keys=["model", "critic"])
    moved = max(float((start["model"][k] - end["model"][k]).abs().max()) for k in start["model"])
    critic_moved = max(float((start["critic"]["model"][k] - end["critic"]["model"][k]).abs().max())
                       for k in start["critic"]["model"])
    assert moved > 1e-4 and critic_moved > 1e-4  # the five updates changed both, so equal weights mean something

    out = command_here(["replay", f"trainer.checkpoint={ppo_run / 'checkpoints' / 'step_000000'}", "replay.steps=1..5"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines if ln.startswith("step ")] == [f"step {k}" for k in range(1, 6)]
    assert all("critic/vf_loss" in ln for ln in lines if ln.startswith("step "))
    diff = float(lines[-1].rsplit(":", 1)[1])
    assert lines[-1].startswith("max abs diff to the run's step 5: ") and diff <= 1e-6


@pytest.mark.slow
def test_a_grpo_run_replays_to_its_own_weights(tmp_path, ray_local, command_here):
    """GRPO, no critic: 5 steps dumped (checkpoints at steps 0 and 5), replayed from step 0 in this process: the
    replay's weights equal the run's step-5 weights, which the five updates moved."""
    run = tmp_path / "run"
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    start = load_checkpoint(run / "checkpoints" / "step_000000", keys=["model"])["model"]
    end = load_checkpoint(run / "checkpoints" / "step_000005", keys=["model"])["model"]
    assert max(float((start[k] - end[k]).abs().max()) for k in start) > 1e-4
    assert "values" not in read_dump(run / "rollouts" / "step_000005.parquet").tensors

    out = command_here(["replay", f"trainer.checkpoint={run / 'checkpoints' / 'step_000000'}", "replay.steps=1..5"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.splitlines()[-1]
    assert last.startswith("max abs diff to the run's step 5: ") and float(last.rsplit(":", 1)[1]) <= 1e-6, last


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    (["replay.steps=1..9"], "replay.steps=1..9: the dumps in {run}/rollouts hold steps 1..5; step 6 is missing"),
    (["replay.steps=2..5"], "replay.steps=2..5: the checkpoint holds step 0, so a replay from it starts at step 1"),
    (["replay.steps=one"], "replay.steps=one: must be K..M (e.g. 1..5)"),
    (["replay.rollouts={run}/nowhere"], "replay.rollouts={run}/nowhere: no rollout dumps there (a run writes them "
                                        "with trainer.save_rollouts=true)"),
])
def test_a_range_the_dumps_do_not_cover_is_one_line_and_exit_2(ppo_run, capsys, args, line):
    from openmanus_rl_core.cli import main

    code = main(["replay", f"trainer.checkpoint={ppo_run / 'checkpoints' / 'step_000000'}",
                 *(a.format(run=ppo_run) for a in args)])  # refused before Ray or a worker starts
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [f"error: {line.format(run=ppo_run)}"], err


@pytest.mark.slow
def test_inspect_tables_each_step_and_writes_the_browser_over_its_samples(ppo_run, capsys):
    from openmanus_rl_core.cli import main

    assert main(["inspect", str(ppo_run), "--steps", "4..5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in lines[1:6]]
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"] and all(r[1] == "8" and r[2] == "4" for r in rows)
    assert all(r[6] == "0:8" for r in rows)  # lockstep: every sample trained by the weights that generated it
    page = (ppo_run / "rollouts" / "inspect.html").read_text()
    assert lines[-1] == f"browser over steps 4, 5: {ppo_run / 'rollouts' / 'inspect.html'}"
    assert page.count("<details id='ep") == 16 and "(step 5)" in page and "(step 3)" not in page
    # an observation's own text, without the chat template's turn markers around it
    assert "<pre class='obs'>Unknown action. Actions: open box, say &lt;word&gt;.</pre>" in page


@pytest.mark.long
@pytest.mark.parametrize("mode", ["lockstep", "episodes", "stream"])
def test_three_kills_lose_no_task_and_train_none_twice(tmp_path, cli_env, mode):
    """12 steps on the latency env (heavy-tailed step times), killed with kill -9 at three seeded random steps and
    resumed each time. Every task the sampler handed out is trained once (n samples), or recorded as dropped, or
    still in the stream's queue at the end: none lost, none twice. The stream (η=2) keeps groups in flight across
    checkpoints; lockstep and `rollout.mode=episodes` train them in the sampler's order."""
    import random

    import pyarrow.parquet as pq

    from openmanus_rl_core.data.sampler import TaskSampler
    from openmanus_rl_core.data.tasks import load_tasks

    run = tmp_path / "run"
    extra = {"lockstep": [], "episodes": ["rollout.mode=episodes"], "stream": ["rollout.max_staleness=2"]}[mode]
    cmd = [str(BIN / "openmanus-rl"), "train", *[o for o in SMALL if not o.startswith(("env=", "trainer.total_steps=",
                                                                                          "trainer.save_freq="))],
           "env=latency", "env.kwargs.median_ms=20", "trainer.total_steps=12", "trainer.save_freq=2", *extra,
           f"trainer.run_dir={run}"]
    kills = sorted(random.Random(7).sample(range(2, 12), 3))
    for i, step in enumerate(kills):
        kill_once_written(cmd + (["trainer.resume=auto"] if i else []), run / "rollouts" / f"step_{step:06d}.parquet",
                          cli_env)
    out = subprocess.run([*cmd, "trainer.resume=auto"], env=cli_env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    final = load_checkpoint(run / "checkpoints" / "step_000012", keys=["sampler", "stream"] if mode == "stream"
                            else ["sampler"])
    tasks = load_tasks(run / "data" / "train.parquet")
    sampler = TaskSampler(tasks, 4, seed=0)
    position = final["sampler"]["epoch"] * len(tasks) + final["sampler"]["position"]
    handed_out = [tasks[i]["task_id"] for e in range(final["sampler"]["epoch"] + 1) for i in sampler.order(e)][:position]
    trained, dropped = [], []
    for k in range(1, 13):
        table = pq.read_table(run / "rollouts" / f"step_{k:06d}.parquet").to_pydict()
        groups = dict(zip(table["group_id"], table["task_id"]))
        assert all(table["group_id"].count(g) == 2 for g in groups), k  # whole groups of n=2
        trained += groups.values()
        left_out = run / "rollouts" / f"dropped_{k:06d}.jsonl"
        if left_out.exists():
            dropped += [json.loads(line)["task_id"] for line in left_out.read_text().splitlines()]
    queued = [row["task_id"] for row in (final.get("stream") or {}).get("queue", [])]
    assert sorted(trained + dropped + queued) == sorted(handed_out)
    if mode != "stream":  # lockstep, and episodes that each run at their own pace: the sampler's order, step by step
        assert trained == handed_out and not dropped and not queued
    else:  # the stream draws ahead of training: groups were in flight at every checkpoint, the last one included
        assert queued and len(trained) == 12 * 4
