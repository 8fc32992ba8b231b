"""The Python API: ``openmanus_rl_core.train(overrides, rewards=...)`` runs what the CLI runs, with plain Python
reward callables as components, and returns the final metrics; ``evaluate`` scores the run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_resume_config import SMALL


def readme_python_block() -> str:
    """The README's Python API example, as written."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    return re.search(r"```python\n(.*?)```", text[text.index("From Python"):], re.S).group(1)


def test_the_readme_example_trains_with_a_callable_reward_and_returns_the_metrics(tmp_path, ray_local, monkeypatch):
    """The README block runs as written, as a script of its own (``__main__``), in this process on the tests' shared
    Ray; only its runs are made small (the tiny test model, 2 steps, a folder of this test), by adding overrides in
    front of the call."""
    import openmanus_rl_core.api as api

    run = tmp_path / "run"
    small = [*SMALL, "trainer.total_steps=2", f"trainer.run_dir={run}"]
    train = api.train
    monkeypatch.setattr(api, "train", lambda overrides=None, **kw: train([*(overrides or []), *small], **kw))
    monkeypatch.chdir(tmp_path)
    script = {"__name__": "__main__"}
    exec(compile(readme_python_block(), "README.md", "exec"), script)
    got = json.loads(json.dumps({"metrics": script["metrics"], "eval": script["result"]}))  # as the script prints
    metrics = got["metrics"]
    assert metrics["run_dir"] == str(run)
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 2
    # short(trajectory) = 1 / (1 + turns), weighted 0.1, logged like any component
    assert 0 < last["train/reward/short/raw_mean"] <= 0.5
    assert abs(last["train/reward/short/mean"] - 0.1 * last["train/reward/short/raw_mean"]) < 1e-9
    assert metrics["train/reward/short/mean"] == last["train/reward/short/mean"]
    assert metrics["val/reward_mean"] == last["val/reward_mean"] and "val/reward/short/mean" in last
    assert got["eval"]["tasks"] == 2 and "reward/goal/mean" in got["eval"] and "reward/short/mean" in got["eval"]


def test_a_plain_callable_weighs_1_and_a_pair_gives_its_weight():
    from openmanus_rl_core.rewards.callables import callable_specs

    def turns(t):
        return float(t.num_turns)

    specs = callable_specs({"turns": turns, "half": (turns, 0.5)})
    assert [(s.label, s.name, s.weight) for s in specs] == [("turns", "python:" + turns.__qualname__, 1.0),
                                                            ("half", "python:" + turns.__qualname__, 0.5)]


def test_a_bad_reward_callable_is_refused_before_anything_starts(tmp_path):
    import pytest

    import openmanus_rl_core as omrl
    from openmanus_rl_core.config import ConfigError

    with pytest.raises(ConfigError) as e:
        omrl.train([*SMALL, f"trainer.run_dir={tmp_path / 'run'}"], rewards={"x": 3})
    assert str(e.value) == "rewards['x']=3: must be a callable fn(trajectory) -> float, or (fn, weight)"
    assert not (tmp_path / "run").exists()



def _sigterm_here(trainer) -> None:
    """Sends this process SIGTERM and waits until the trainer's handler has taken it."""
    import os
    import signal
    import time

    assert signal.getsignal(signal.SIGTERM) == trainer.stop._handle  # never the default action: it would end pytest
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while trainer.stop.requested is None and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("when", ["in the step loop", "before the run folder", "before the run's settings"])
def test_train_stopped_by_sigterm_raises_and_does_not_return_metrics(when, tmp_path, monkeypatch, capsys):
    """A real SIGTERM to this process (set-up and fit stubbed: no Ray, no model): ``train`` raises, with the command
    that continues the run when there is one; the metrics the loop had are not handed back as if it ended."""
    import signal

    import openmanus_rl_core as omrl
    from openmanus_rl_core.run.trainer import Trainer

    run = tmp_path / "run"

    def setup(self):
        if when == "before the run folder":
            _sigterm_here(self)  # the handler raises KeyboardInterrupt at once: nothing to save
        self.run_dir = run
        run.mkdir()
        if when == "before the run's settings":  # the folder made, config.json (what a resume composes) not yet
            _sigterm_here(self)
        (run / "config.json").write_text("{}")  # the run's settings recorded: a stop from here can continue

    def fit(self):
        self.stop.interrupt = False  # in the step loop: the signal asks, the loop stops between steps
        _sigterm_here(self)
        return {"train/reward_mean": 1.0, "step": 1}

    monkeypatch.setattr(Trainer, "setup", setup)
    monkeypatch.setattr(Trainer, "fit", fit)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as e:
        omrl.train([*SMALL, f"trainer.run_dir={run}"])
    printed = capsys.readouterr().out
    if when == "in the step loop":
        assert str(e.value) == (f"training stopped by a signal; continue with omrl.train(['trainer.run_dir={run}', "
                                f"'trainer.resume=auto'], rewards=...)")
        # the seconds are the run's own (1s on a loaded machine): not what is checked
        assert re.search(rf"stopped by SIGTERM after \d+s; no step completed; continue with: openmanus-rl train "
                         rf"trainer.run_dir={re.escape(str(run))} trainer.resume=auto", printed), printed
    else:
        assert str(e.value) == "training stopped by a signal before the run started; nothing to continue"
        assert re.search(r"stopped by SIGTERM after \d+s, before the run started; nothing to continue",
                         printed), printed
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
