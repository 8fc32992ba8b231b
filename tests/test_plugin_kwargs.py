"""Plugin-owned settings are checked with the schema: one line, exit 2, before a run folder, Ray or a model exists.

Each case runs the real console script; a run folder under the output dir would mean the check came too late."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.config.plugin_kwargs import accepted_kwargs, check_kwargs

CLI = str(Path(sys.executable).parent / "openmanus-rl")


def _refused(args: list[str], tmp_path: Path, cli_env: dict, command: str = "train") -> tuple[str, float]:
    out_dir = tmp_path / "outputs"
    t0 = time.perf_counter()
    out = subprocess.run([CLI, command, *args, f"trainer.output_dir={out_dir}"], env=cli_env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    seconds = time.perf_counter() - t0
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert not out_dir.exists(), sorted(p.name for p in out_dir.rglob("*"))
    return lines[0], seconds


# One misspelled kwarg per plugin kind, each with the line it must print.
MISSPELLED = [
    (["env=textcraft", "env.kwargs.max_dept=1"],
     "error: env.kwargs.max_dept=1: unknown key of the env 'textcraft'; did you mean env.kwargs.max_depth or "
     "env.kwargs.min_depth?"),
    (["template.kwargs.thinkk=false"],
     "error: template.kwargs.thinkk=false: unknown key of the template 'react'; did you mean template.kwargs.think "
     "or template.kwargs.think_tag?"),
    (["allocator=discounted", "allocator.kwargs.gama=0.9"],
     "error: allocator.kwargs.gama=0.9: unknown key of the allocator 'discounted'; did you mean "
     "allocator.kwargs.gamma?"),
    (["memory=summary", "memory.kwargs.max_char=10"],
     "error: memory.kwargs.max_char=10: unknown key of the memory 'summary'; did you mean memory.kwargs.max_chars?"),
    (["trainer.loggers=[tensorboard,wandb]", "trainer.tracker_kwargs.wandb.projct=x"],
     "error: trainer.tracker_kwargs.wandb.projct=x: unknown key of the tracker 'wandb'; did you mean "
     "trainer.tracker_kwargs.wandb.project?"),
    (["trainer.loggers=[mlflow]", "trainer.tracker_kwargs.mlflow.experimnt=a"],
     "error: trainer.tracker_kwargs.mlflow.experimnt=a: unknown key of the tracker 'mlflow'; did you mean "
     "trainer.tracker_kwargs.mlflow.experiment?"),
    (["trainer.tracker_kwargs.tensorboard.hparam=false"],
     "error: trainer.tracker_kwargs.tensorboard.hparam=false: unknown key of the tracker 'tensorboard'; did you mean "
     "trainer.tracker_kwargs.tensorboard.hparams?"),
    (["reward=process", "reward.components.process.kwargs.moed=sum"],
     "error: reward.components.process.kwargs.moed=sum: unknown key of the reward 'process'; did you mean "
     "reward.components.process.kwargs.mode?"),
]


@pytest.mark.parametrize("args,line", MISSPELLED, ids=[a[-1].split("=")[0] for a, _ in MISSPELLED])
def test_a_misspelled_plugin_kwarg_is_one_line_exit_2_and_no_run_folder(args, line, tmp_path, cli_env):
    got, seconds = _refused(args, tmp_path, cli_env)
    assert got == line
    assert seconds < 10  # about 1.5 s alone on this machine; the bound leaves room for a busy one


def test_a_bad_reward_weight_is_one_line_exit_2(tmp_path, cli_env):
    got, _ = _refused(["reward.components.goal.weight=abc"], tmp_path, cli_env)
    assert got == "error: reward.components.goal.weight=abc: must be a finite number (e.g. 1.0)"


def test_a_misspelled_reward_spec_key_gets_a_did_you_mean(tmp_path, cli_env):
    got, _ = _refused(["reward.components.goal.wieght=2"], tmp_path, cli_env)
    assert got == ("error: reward.components.goal.wieght=2: unknown key of the reward component 'goal'; did you "
                   "mean reward.components.goal.weight?")


def test_a_kwarg_of_the_wrong_type_names_the_annotation(tmp_path, cli_env):
    got, _ = _refused(["env=textcraft", "env.kwargs.max_depth=abc"], tmp_path, cli_env)
    assert got == "error: env.kwargs.max_depth=abc: must be an integer or null (env 'textcraft')"


def test_true_for_an_integer_kwarg_is_refused_though_a_bool_is_an_int_in_python():
    with pytest.raises(ConfigError) as e:
        load(["env=textcraft", "env.kwargs.min_depth=true"])
    assert str(e.value) == "env.kwargs.min_depth=true: must be an integer (env 'textcraft')"
    with pytest.raises(ConfigError) as e:
        load(["env=textcraft", "env.kwargs.max_depth=false"])
    assert str(e.value) == "env.kwargs.max_depth=false: must be an integer or null (env 'textcraft')"
    assert load(["env=textcraft", "env.kwargs.min_depth=2"]).env.kwargs["min_depth"] == 2


def test_eval_checks_plugin_kwargs_too(tmp_path, cli_env):
    got, _ = _refused(["env=textcraft", "env.kwargs.max_dept=1"], tmp_path, cli_env, command="eval")
    assert got.startswith("error: env.kwargs.max_dept=1: unknown key of the env 'textcraft'")


def test_good_plugin_kwargs_pass():
    c = load(["env=textcraft", "env.kwargs.max_depth=2", "reward.components.goal.weight=2"])
    assert c.env.kwargs["max_depth"] == 2 and c.reward.components["goal"]["weight"] == 2


class _Declared:
    """A plugin that declares its kwargs as a dataclass: names and types come from it."""

    @dataclasses.dataclass
    class Kwargs:
        size: int = 3
        label: Optional[str] = None

    def __init__(self, **kwargs):
        self.opts = self.Kwargs(**kwargs)


def _open_ended(a: int = 1, **rest):
    return a


def test_a_declared_kwargs_dataclass_checks_names_and_types():
    names, open_ended = accepted_kwargs(_Declared)
    assert set(names) == {"size", "label"} and not open_ended
    check_kwargs("env.kwargs", "env 'x'", _Declared, {"size": 4, "label": None})
    with pytest.raises(ConfigError) as e:
        check_kwargs("env.kwargs", "env 'x'", _Declared, {"size": "big"})
    assert str(e.value) == "env.kwargs.size=big: must be an integer (env 'x')"
    with pytest.raises(ConfigError) as e:
        check_kwargs("env.kwargs", "env 'x'", _Declared, {"sise": 4})
    assert str(e.value) == "env.kwargs.sise=4: unknown key of the env 'x'; did you mean env.kwargs.size?"


def test_a_factory_with_var_kwargs_takes_any_name_but_checks_the_named_ones():
    check_kwargs("env.kwargs", "env 'x'", _open_ended, {"anything": 1})
    with pytest.raises(ConfigError) as e:
        check_kwargs("env.kwargs", "env 'x'", _open_ended, {"a": 1.5})
    assert str(e.value) == "env.kwargs.a=1.5: must be an integer (env 'x')"


def test_a_key_the_command_does_not_read_is_refused(tmp_path, cli_env):
    got, seconds = _refused(["trainer.checkpoint=some/run"], tmp_path, cli_env)
    assert got == ("error: trainer.checkpoint=some/run: trainer.checkpoint is read by eval, export, rollout, serve and "
                   "replay, not by train; to continue a run, use trainer.run_dir=<run> trainer.resume=auto (or "
                   "trainer.resume=<checkpoint>)")
    got, _ = _refused(["trainer.resume=auto"], tmp_path, cli_env, command="eval")
    assert got == ("error: trainer.resume=auto: trainer.resume is read by train, not by eval; the checkpoint "
                   "they read is trainer.checkpoint")
    got, _ = _refused(["export.dir=x"], tmp_path, cli_env)
    assert got == "error: export.dir=x: export.dir is read by export, not by train"


def test_tracker_settings_for_a_tracker_not_selected_or_of_the_wrong_type_are_refused(tmp_path, cli_env):
    line, _ = _refused(["trainer.tracker_kwargs.tensorbord.hparams=false"], tmp_path, cli_env)
    assert line == ("error: trainer.tracker_kwargs.tensorbord: 'tensorbord' is not a tracker of "
                    "trainer.loggers=[tensorboard]; did you mean trainer.tracker_kwargs.tensorboard?")
    line, _ = _refused(["trainer.loggers=[wandb]", "trainer.tracker_kwargs.wandb.mode=onlin"], tmp_path, cli_env)
    assert line == ("error: trainer.tracker_kwargs.wandb.mode=onlin: must be one of 'online', 'offline', 'disabled' "
                    "or null (tracker 'wandb')")
