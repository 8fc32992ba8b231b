"""Rewards given as Python callables belong to their run: the run records them by name, an eval or a resume takes
them again, and one that is not given them is refused in one line naming them (or, with
``reward.missing_callables=drop``, goes on without them and says so). Real runs of the tiny model, in this process
(on the tests' shared Ray): those given callables run a Python script as a script of its own (its callables live in
its ``__main__``), the commands that are not given them run ``cli.main``."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from test_resume_config import SMALL

RECORD = [{"label": "short", "weight": 0.1, "qualname": "short", "module": "__main__"}]


def _python(body: str, cwd: Path) -> dict:
    """A Python script, the callables below and then ``body``, run as a script of its own (``__main__``) in this
    process, in the folder ``cwd``; its names when it ends."""
    script = textwrap.dedent("""
        import json, sys
        import openmanus_rl_core as omrl

        def short(trajectory):
            return 1.0 / (1 + trajectory.num_turns)

        def turns(trajectory):
            return float(trajectory.num_turns)
    """) + textwrap.dedent(body)
    names, here = {"__name__": "__main__"}, os.getcwd()
    os.chdir(cwd)
    try:
        exec(compile(script, "<script>", "exec"), names)
    finally:
        os.chdir(here)
    return names


@pytest.fixture(scope="module")
def run_with_a_callable(tmp_path_factory, ray_local):
    """A 1-step run trained with ``rewards={"short": (short, 0.1)}``."""
    tmp = tmp_path_factory.mktemp("callable")
    run = tmp / "run"
    _python(f"""
        omrl.train({[*SMALL, "trainer.total_steps=1", f"trainer.run_dir={run}"]!r},
                   rewards={{"short": (short, 0.1)}})
    """, tmp)
    return run


def test_the_run_records_its_callables_by_name(run_with_a_callable):
    run = run_with_a_callable
    assert json.loads((run / "config.json").read_text())["python_rewards"] == RECORD
    from openmanus_rl_core.checkpoint.store import open_checkpoint

    meta = open_checkpoint(str(run / "checkpoints" / "step_000001"), keys=["meta"])[1]["meta"]
    assert meta["python_rewards"] == RECORD


def test_a_command_line_eval_or_resume_without_them_is_refused_in_one_line(run_with_a_callable, command_here):
    run = run_with_a_callable
    before = sorted(p.name for p in run.iterdir())
    ckpt = run / "checkpoints" / "step_000001"
    how = {"eval": "score it from Python with omrl.evaluate([...], rewards={...}) giving them",
           "resume": "resume from Python with omrl.train([...], rewards={...}) giving them"}
    for args, what, kind in (
            (["eval", f"trainer.checkpoint={run}"], f"eval of {ckpt}", "eval"),
            (["train", f"trainer.run_dir={run}", "trainer.resume=auto", "trainer.total_steps=2"],
             f"the resume of {run}", "resume")):
        out = command_here(args)
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        assert out.stderr.splitlines() == [
            f"error: {what}: the run had reward(s) given as Python callables that were not given again: 'short' "
            f"(__main__.short); {how[kind]}, or set reward.missing_callables=drop to go on without them"]
    assert sorted(p.name for p in run.iterdir()) == before and not (run / "config_history.jsonl").exists()


def test_drop_scores_without_them_and_says_so(run_with_a_callable, command_here, tmp_path):
    run = run_with_a_callable
    result = tmp_path / "eval.json"
    out = command_here(["eval", f"trainer.checkpoint={run}", "reward.missing_callables=drop",
                        f"trainer.eval_output={result}"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (f"reward.missing_callables=drop: eval of {run / 'checkpoints' / 'step_000001'} goes on without the "
            f"run's callable reward(s) 'short' (__main__.short)") in out.stdout
    assert "from the run: env=key_door, template=react, reward=goal+format+invalid_action" in out.stdout
    scored = json.loads(result.read_text())
    assert "reward/goal/mean" in scored and "reward/short/mean" not in scored


def test_eval_and_resume_from_python_take_them_again(run_with_a_callable, tmp_path):
    """Given again, eval scores them, and a resume goes on with them; a resume that adds one records the change in
    the run's config history (config.json stays the record of the first steps)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_with_a_callable, run)
    record = (run / "config.json").read_bytes()
    out = _python(f"""
        result = omrl.evaluate(["trainer.checkpoint={run}"], rewards={{"short": (short, 0.1)}})
        metrics = omrl.train(["trainer.run_dir={run}", "trainer.resume=auto", "trainer.total_steps=2"],
                             rewards={{"short": (short, 0.1), "turns": (turns, 0.5)}})
    """, tmp_path)
    got = json.loads(json.dumps({"eval": out["result"], "train": out["metrics"]}))  # as the script would print them
    assert 0 < got["eval"]["reward/short/mean"] <= 0.1 * 0.5
    assert got["train"]["train/reward/short/mean"] > 0 and got["train"]["train/reward/turns/mean"] >= 0.5
    assert (run / "config.json").read_bytes() == record
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [(h["step"], h["changes"]) for h in history] == [
        (2, {"trainer.total_steps": {"from": 1, "to": 2},
             "python_rewards": {"from": RECORD, "to": [*RECORD, {"label": "turns", "weight": 0.5,
                                                                 "qualname": "turns", "module": "__main__"}]}})]
