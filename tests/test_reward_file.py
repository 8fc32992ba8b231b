"""Reward components from a Python file (verl's ``custom_reward_function`` layout): ``path`` + ``function``, loaded
without a package, called as verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)``;
every error names the file and the function."""

from __future__ import annotations

import pytest

from openmanus_rl_core.cli import main
from openmanus_rl_core.config.loading import compose, check
from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.rewards.files import RewardFileError

VERL_SCORE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature: 1 for the right answer, plus a bonus read from extra_info."""
    bonus = extra_info["bonus"] if extra_info else 0.0
    return {"score": float(solution_str.strip().endswith(str(ground_truth))) + bonus,
            "from_math": float(data_source == "math")}


def other_name(solution_str, ground_truth, scale=1.0):
    return scale * float(str(ground_truth) in solution_str)
'''


def _trajectory(reply: str, task: dict) -> Trajectory:
    turn = Turn(response=reply, action=ParsedAction("answer", reply, True), observation="", reward=0.0, done=True)
    return Trajectory(task_id=0, seed=0, group_id=0, initial_observation="q", turns=[turn], task=task)


def test_a_verl_style_file_scores_with_the_task_fields_verl_passes(tmp_path):
    score = tmp_path / "score.py"
    score.write_text(VERL_SCORE)
    composer = RewardComposer.from_config({"answer": {"path": str(score), "weight": 2.0},
                                           "named": {"path": str(score), "function": "other_name",
                                                     "kwargs": {"scale": 0.5}}})
    task = {"data_source": "math", "reward_model": {"ground_truth": "42"}, "extra_info": {"bonus": 0.25}}
    right = composer.compose(_trajectory("so the answer is 42", task))
    assert right.parts == {"answer": pytest.approx(2.0 * 1.25), "named": pytest.approx(0.5)}
    assert right.total == pytest.approx(3.0)
    wrong = composer.compose(_trajectory("7", {**task, "data_source": "gsm8k", "extra_info": None}))
    assert wrong.parts == {"answer": 0.0, "named": 0.0}
    assert composer.specs[0].name == f"{score}:compute_score"


def test_the_config_check_reads_the_file_without_running_it(tmp_path, capsys):
    score = tmp_path / "score.py"
    score.write_text("raise SystemExit('ran at config time')\n" + VERL_SCORE)
    cfg = check(compose([f"+reward.components.answer.path={score}"]), training=False)
    assert cfg.reward.components["answer"]["path"] == str(score)
    with pytest.raises(RewardFileError, match=rf"reward 'x': {score} defines no function 'scores' \(its functions: "
                                              r"compute_score, other_name\); set function=<name>"):
        check(compose([f"+reward.components.x.path={score}", "+reward.components.x.function=scores"]))
    assert main(["train", f"+reward.components.x.path={tmp_path / 'nope.py'}"]) == 2
    assert f"reward 'x': path={tmp_path / 'nope.py'} is not a file" in capsys.readouterr().err


@pytest.mark.parametrize("binding", [
    "compute_score = _exact",
    "compute_score: object = _exact",
    "other, compute_score = None, _exact",
    "from operator import eq as compute_score",
])
def test_a_scorer_bound_by_assignment_or_import_is_accepted_and_scores(tmp_path, binding):
    score = tmp_path / "score.py"
    score.write_text("def _exact(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    return float(solution_str == str(ground_truth))\n\n" + binding + "\n")
    cfg = check(compose([f"+reward.components.answer.path={score}"]), training=False)
    assert cfg.reward.components["answer"]["path"] == str(score)
    if "operator" in binding:
        return  # operator.eq takes two arguments: accepted by the check, not a scorer to call here
    composer = RewardComposer.from_config({"answer": {"path": str(score)}})
    task = {"data_source": "x", "reward_model": {"ground_truth": "42"}}
    assert composer.compose(_trajectory("42", task)).parts == {"answer": 1.0}
    assert composer.compose(_trajectory("41", task)).parts == {"answer": 0.0}


@pytest.mark.parametrize("text,spec,message", [
    ("def compute_score(:\n", {}, r"score.py line 1: invalid syntax|score.py line 1: "),
    ("import no_such_module_xyz\ndef compute_score(solution_str, ground_truth): return 1.0\n", {},
     r"importing .*score.py failed: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("compute_score = 3\n", {}, r"score.py has no function 'compute_score' \(compute_score is a int\)"),
    ("def compute_score(answer): return 1.0\n", {},
     r"score.py: reward function compute_score must accept the keyword arguments solution_str and ground_truth"),
    (VERL_SCORE, {"name": "goal"}, r"give either name .* or path .*, not both"),
])
def test_a_bad_file_is_an_error_naming_the_file_and_function(tmp_path, text, spec, message):
    score = tmp_path / "score.py"
    score.write_text(text)
    with pytest.raises(RewardFileError, match=message):
        if "line 1" in message:
            from openmanus_rl_core.rewards.files import check_reward_file

            check_reward_file("x", {"path": str(score)})
        else:
            RewardComposer.from_config({"x": {"path": str(score), **spec}})
