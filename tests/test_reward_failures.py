"""A reward component that fails is loud: on every sample of a step it stops the run (exit 1, one line naming it,
its exception and one trajectory) unless ``reward.on_error=warn``; on some samples it prints one line per step with
the count."""

from __future__ import annotations

import pytest

from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.rewards.failures import RewardFailure, check_reward_failures
from openmanus_rl_core.rewards.composer import ComponentSpec, RewardComposer
from test_resume_config import SMALL


class OddTasksFail:
    def compute(self, trajectory):
        if trajectory.task_id % 2:
            raise ZeroDivisionError("division by zero")
        return 1.0


class Fine:
    def compute(self, trajectory):
        return 0.5


def _trajectories(n: int) -> list[Trajectory]:
    turn = Turn(response="<action>go north</action> and more", action=ParsedAction("action", "go north", True),
                observation="ok", reward=0.0, done=True)
    return [Trajectory(task_id=i, seed=0, group_id=i, initial_observation="a room", turns=[turn]) for i in range(n)]


def _composed(n: int):
    composer = RewardComposer([ComponentSpec("odd", "odd", 1.0, OddTasksFail()), ComponentSpec("fine", "fine", 1.0,
                                                                                               Fine())])
    trajectories = _trajectories(n)
    return composer, composer.compose_batch(trajectories)[0], trajectories


def test_an_env_mix_sources_own_component_failing_on_all_its_samples_stops_the_run():
    composer = RewardComposer([ComponentSpec("fine", "fine", 1.0, Fine()),
                               ComponentSpec("legs.odd", "odd", 1.0, OddTasksFail(), source="legs")])
    trajectories = _trajectories(4)
    for t in trajectories:  # tasks 1 and 3 are legs' (and fail), 0 and 2 another source's
        t.task = {"source": "legs" if t.task_id % 2 else "door"}
    breakdowns = composer.compose_batch(trajectories)[0]
    lines: list[str] = []
    with pytest.raises(RewardFailure, match=r"reward 'legs.odd' failed on 2 of 2 samples at step 3"):
        check_reward_failures(composer.labels, breakdowns, trajectories, 3, "raise", lines.append)
    check_reward_failures(composer.labels, breakdowns, trajectories, 3, "warn", lines.append)
    assert lines == ["WARNING: reward 'legs.odd' failed on 2 of 2 samples at step 3 (scored 0 there): "
                     "ZeroDivisionError: division by zero"]


def test_a_partial_failure_is_one_line_per_step_with_the_count():
    composer, breakdowns, trajectories = _composed(8)
    lines: list[str] = []
    for on_error in ("raise", "warn"):
        check_reward_failures(composer.labels, breakdowns, trajectories, 3, on_error, lines.append)
    assert lines == ["reward 'odd' failed on 4 of 8 samples at step 3 (scored 0 there): ZeroDivisionError: "
                     "division by zero"] * 2


def test_a_failure_on_every_sample_raises_naming_the_component_and_one_trajectory_unless_warn():
    composer, breakdowns, trajectories = _composed(8)
    odd = [b for b, t in zip(breakdowns, trajectories) if t.task_id % 2]
    with pytest.raises(RewardFailure) as e:
        check_reward_failures(composer.labels, odd, trajectories[1::2], 1, "raise", print)
    assert str(e.value) == ("reward 'odd' failed on 4 of 4 samples at step 1 (scored 0 there): ZeroDivisionError: "
                            "division by zero; one of them: task_id=1, 1 turn(s), last reply '<action>go north"
                            "</action> and more'. Every sample failed, so the run stopped (reward.on_error=warn goes "
                            "on)")
    lines: list[str] = []
    check_reward_failures(composer.labels, odd, trajectories[1::2], 1, "warn", lines.append)
    assert lines == ["WARNING: reward 'odd' failed on 4 of 4 samples at step 1 (scored 0 there): ZeroDivisionError: "
                     "division by zero"]


def test_a_reward_that_raises_on_every_sample_stops_the_run_in_its_first_step(tmp_path, ray_local, command_here):
    """``openmanus-rl train`` (its function, ``cli.main``, in this process on the tests' shared Ray)."""
    score = tmp_path / "score.py"
    score.write_text("def compute_score(solution_str, ground_truth, **kwargs):\n    return 1 / 0\n")
    run = tmp_path / "run"
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=3",
                        f"+reward.components.broken.path={score}"])
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: reward 'broken' failed on 4 of 4 samples at step 1 (scored 0 there): ZeroDivisionError: division by "
        "zero; one of them: task_id=")
    assert "Traceback" not in out.stderr
    assert not (run / "checkpoints").exists()
    steps = [line.split(":")[0] for line in out.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["step 0 (untrained)"]  # no training step was logged
