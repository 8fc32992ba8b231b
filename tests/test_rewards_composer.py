"""The reward composer (openmanus_rl_core.rewards.composer): weights, breakdowns, per-turn splits, function-style
rewards, and failure counting."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.plugin.registry import UnknownPluginError, registry
from openmanus_rl_core.rewards.composer import (
    ComponentSpec,
    FunctionReward,
    RewardBreakdown,
    RewardComposer,
    build_component,
)
from openmanus_rl_core.testing import check_reward, sample_trajectories


def traj(rewards=(0.0,), valid=None, success=None, task=None, responses=None) -> Trajectory:
    n = len(rewards)
    valid = [True] * n if valid is None else valid
    responses = responses or [f"<action>a{i}</action>" for i in range(n)]
    turns, pos = [], 0
    for i in range(n):
        turns.append(Turn(response=responses[i], action=ParsedAction("action", f"a{i}", valid[i]),
                          observation="obs", reward=rewards[i], done=i == n - 1, span=(pos, pos + 4)))
        pos += 7  # 4 agent tokens, 3 observation tokens
    return Trajectory(task_id=0, seed=0, group_id=0, initial_observation="start", turns=turns,
                      success=success, response_length=pos, task=dict(task or {}))


class Const:
    def __init__(self, value=1.0):
        self.value = value

    def compute(self, trajectory):
        return self.value


class PerStep:
    """A process reward: the env reward of each step."""

    def compute(self, trajectory):
        return trajectory.env_reward

    def compute_turns(self, trajectory):
        return [t.reward for t in trajectory.turns]


class Boom:
    def compute(self, trajectory):
        raise RuntimeError("scorer crashed")


def composer(**components) -> RewardComposer:
    return RewardComposer([ComponentSpec(label, label, w, c) for label, (c, w) in components.items()])


# ------------------------------------------------------------------------------------------- weights
def test_weights_parts_and_total():
    c = composer(a=(Const(1.0), 2.0), b=(Const(-0.5), 0.1))
    b = c.compose(traj([0.0, 0.0, 0.0]))
    assert isinstance(b, RewardBreakdown)
    assert b.parts == {"a": 2.0, "b": pytest.approx(-0.05)}
    assert b.raw == {"a": 1.0, "b": -0.5}
    assert b.total == pytest.approx(1.95)
    # No compute_turns: everything counts on the last turn.
    assert b.turn_rewards == [0.0, 0.0, pytest.approx(1.95)]
    assert b.errors == {}


def test_compute_turns_spread_per_turn():
    c = composer(goal=(Const(1.0), 1.0), step=(PerStep(), 0.5))
    b = c.compose(traj([1.0, 0.0, 2.0]))
    assert b.parts == {"goal": 1.0, "step": 1.5}
    assert b.turn_rewards == [0.5, 0.0, pytest.approx(1.0 + 1.0)]
    assert sum(b.turn_rewards) == pytest.approx(b.total) == pytest.approx(2.5)


def test_zero_turns_total_defined():
    c = composer(a=(Const(0.25), 2.0), step=(PerStep(), 1.0))
    b = c.compose(traj([]))
    assert b.turn_rewards == []
    assert b.total == 0.5 and b.parts == {"a": 0.5, "step": 0.0}


def test_compute_turns_mismatch_residual_on_last_turn(caplog):
    class Inconsistent:
        def compute(self, trajectory):
            return 3.0

        def compute_turns(self, trajectory):
            return [1.0, 1.0]

    c = composer(x=(Inconsistent(), 1.0))
    with caplog.at_level(logging.WARNING):
        b = c.compose(traj([0.0, 0.0]))
    assert b.total == 3.0 and b.turn_rewards == [1.0, 2.0]
    assert "compute_turns sums to" in caplog.text


def test_dict_result_gives_score_and_extras():
    c = composer(acc=(Const({"score": 0.5, "exact": 1, "note": "text"}), 2.0))
    bds, metrics = c.compose_batch([traj([0.0]), traj([0.0])])
    assert bds[0].parts == {"acc": 1.0}
    assert bds[0].extras == {"acc/exact": 1.0}  # non-numeric extras are dropped
    assert metrics["reward/acc/mean"] == 1.0
    assert metrics["reward/acc/exact/mean"] == 1.0


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.floats(-10, 10), min_size=1, max_size=4),
    rewards=st.lists(st.floats(-5, 5), min_size=0, max_size=6),
)
def test_property_turn_rewards_sum_to_total(weights, rewards):
    comps = {}
    for i, w in enumerate(weights):
        comps[f"c{i}"] = ((PerStep() if i % 2 else Const(float(i) - 1.5)), w)
    b = composer(**comps).compose(traj(rewards))
    assert len(b.turn_rewards) == len(rewards)
    assert b.total == pytest.approx(sum(b.parts.values()))
    if rewards:
        assert math.fsum(b.turn_rewards) == pytest.approx(b.total, abs=1e-9)
    for i, w in enumerate(weights):
        assert b.parts[f"c{i}"] == pytest.approx(w * b.raw[f"c{i}"])


# ------------------------------------------------------------------------------------- from_config
def test_from_config_builds_registered_class():
    c = RewardComposer.from_config({"goal": {"name": "goal", "weight": 2.0, "kwargs": {}},
                                    "fmt": {"name": "format", "weight": 0.5}})
    assert c.labels == ["goal", "fmt"]
    assert type(c.specs[0].component).__name__ == "GoalReward"
    b = c.compose(traj([0.0, 0.0], success=True))
    assert b.parts == {"goal": 2.0, "fmt": 0.5}


def test_from_config_name_defaults_to_label_and_accepts_omegaconf_and_group_form():
    cfg = OmegaConf.create({"components": {"goal": {"weight": 1.0, "kwargs": {"use_score": True}}}})
    c = RewardComposer.from_config(cfg)
    assert c.specs[0].name == "goal" and c.specs[0].component.use_score is True
    assert c.compose(traj([0.5, 0.25])).total == 0.75
    c2 = RewardComposer.from_config(cfg.components)
    assert c2.labels == ["goal"]


@pytest.mark.parametrize("bad", ["1.0", float("nan"), float("inf"), None, True, [1.0]])
def test_bad_weight_names_label(bad):
    with pytest.raises(ValueError, match="'my_goal'.*weight must be a finite number"):
        RewardComposer.from_config({"my_goal": {"name": "goal", "weight": bad}})


def test_unknown_name_is_registry_error():
    with pytest.raises(UnknownPluginError, match="goall"):
        RewardComposer.from_config({"g": {"name": "goall", "weight": 1.0}})


def test_unknown_spec_key_and_bad_kwargs():
    with pytest.raises(ValueError, match="'g'.*unknown key.*weigth"):
        RewardComposer.from_config({"g": {"name": "goal", "weigth": 1.0}})
    with pytest.raises(TypeError, match="'g'.*cannot build 'goal'"):
        RewardComposer.from_config({"g": {"name": "goal", "kwargs": {"no_such_option": 1}}})


def test_labels_must_be_unique_and_slash_free():
    with pytest.raises(ValueError, match="unique"):
        RewardComposer([ComponentSpec("a", "a", 1.0, Const()), ComponentSpec("a", "a", 1.0, Const())])
    with pytest.raises(ValueError, match="without '/'"):
        RewardComposer([ComponentSpec("a/b", "a", 1.0, Const())])


# ---------------------------------------------------------------------------------- function style
def exact_match(solution_str, ground_truth, data_source=None):
    """A veRL-style scorer without **kwargs: receives only the keywords it names."""
    return 1.0 if ground_truth is not None and f"<action>{ground_truth}</action>" in solution_str else 0.0


def scored(solution_str, ground_truth, **kwargs):
    return {"score": float(solution_str.endswith("</action>")), "gt_len": len(str(ground_truth)),
            "bonus": kwargs.get("bonus", 0)}


def test_function_reward_adapter_reads_final_response_and_ground_truth():
    fr = FunctionReward(exact_match)
    t = traj([0.0, 0.0], task={"ground_truth": "a1", "data_source": "x", "other": 3})
    assert fr.compute(t) == 1.0  # final response is "<action>a1</action>"
    nested = traj([0.0], task={"reward_model": {"ground_truth": "a0"}})
    assert fr.compute(nested) == 1.0
    assert fr.compute(traj([0.0], task={"ground_truth": "zzz"})) == 0.0
    assert fr.compute(traj([])) == 0.0  # no turns: empty solution


def test_function_reward_adapter_conforms():
    check_reward(FunctionReward(exact_match))
    check_reward(FunctionReward(scored, bonus=1))
    assert [FunctionReward(exact_match).compute(t) for t in sample_trajectories()] == [0.0, 1.0, 0.0]


def test_function_reward_passes_task_fields_and_kwargs_to_var_kw():
    seen = {}

    def fn(solution_str, ground_truth, **kw):
        seen.update(kw, solution_str=solution_str, ground_truth=ground_truth)
        return 0.0

    FunctionReward(fn, bonus=2).compute(traj([0.0], task={"ground_truth": "g", "data_source": "ds", "bonus": 1}))
    assert seen == {"solution_str": "<action>a0</action>", "ground_truth": "g", "data_source": "ds", "bonus": 2}


def test_function_reward_unknown_kwarg_or_bad_signature_rejected():
    with pytest.raises(TypeError, match="takes no argument.*'nope'"):
        FunctionReward(exact_match, nope=1)
    with pytest.raises(TypeError, match="must accept the keyword arguments solution_str and ground_truth"):
        FunctionReward(lambda text, answer: 0.0)


def test_build_component_tells_class_object_function_apart():
    from openmanus_rl_rewards.components import GoalReward

    assert isinstance(build_component(GoalReward, {"use_score": True}), GoalReward)
    obj = Const(0.3)
    assert build_component(obj) is obj
    with pytest.raises(TypeError, match="takes no kwargs"):
        build_component(obj, {"x": 1})
    assert isinstance(build_component(scored, {"bonus": 1}), FunctionReward)
    with pytest.raises(TypeError, match="neither"):
        build_component(42)


def test_from_config_with_function_style_entry(monkeypatch):
    """A function registered in the reward group is wrapped; looked up through the real registry object."""
    reg = registry("reward")
    real_get = reg.get
    monkeypatch.setattr(reg, "get", lambda name: scored if name == "scored" else real_get(name))
    c = RewardComposer.from_config({"fmt": {"name": "scored", "weight": 0.5, "kwargs": {"bonus": 3}},
                                    "goal": {"weight": 1.0}})
    bds, metrics = c.compose_batch([traj([0.0], success=True, task={"ground_truth": "abc"}), traj([0.0])])
    assert bds[0].parts == {"fmt": 0.5, "goal": 1.0}
    assert bds[0].extras == {"fmt/gt_len": 3.0, "fmt/bonus": 3.0}
    assert metrics["reward/fmt/mean"] == 0.5
    assert metrics["reward/goal/mean"] == 0.5
    assert metrics["reward/fmt/gt_len/mean"] == pytest.approx((3 + 4) / 2)  # str(None) for the second


# -------------------------------------------------------------------------------------------- errors
def test_errors_counted_batch_goes_on(caplog):
    class SometimesBad:
        def compute(self, trajectory):
            tag = trajectory.task.get("bad")
            if tag == "raise":
                raise KeyError("missing field")
            if tag == "nan":
                return float("nan")
            if tag == "inf":
                return {"score": float("inf")}
            if tag == "str":
                return "oops"
            return 1.0

    c = composer(ok=(Const(1.0), 1.0), flaky=(SometimesBad(), 2.0), boom=(Boom(), 1.0))
    batch = [traj([0.0], task={"bad": b}) for b in (None, "raise", "nan", "inf", "str", None)]
    with caplog.at_level(logging.WARNING, logger="openmanus_rl_core.rewards.composer"):
        bds, metrics = c.compose_batch(batch)
        c.compose_batch(batch)  # same composer again: no new warnings
    assert [b.parts["flaky"] for b in bds] == [2.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert [b.total for b in bds] == [3.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    assert all(math.isfinite(b.total) and sum(b.turn_rewards) == b.total for b in bds)
    assert metrics["reward/flaky/errors"] == 4.0
    assert metrics["reward/boom/errors"] == 6.0
    assert metrics["reward/ok/errors"] == 0.0
    assert metrics["reward/flaky/mean"] == pytest.approx(4.0 / 6)
    assert "KeyError" in bds[1].errors["flaky"] and "non-finite" in bds[2].errors["flaky"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # the first error of each failing label, once
    assert any("'flaky'" in r.getMessage() and "missing field" in r.getMessage() for r in warnings)


def test_bad_compute_turns_counts_as_error():
    class WrongLength(PerStep):
        def compute_turns(self, trajectory):
            return [1.0]

    bds, metrics = composer(w=(WrongLength(), 1.0)).compose_batch([traj([1.0, 1.0])])
    assert bds[0].total == 0.0 and bds[0].turn_rewards == [0.0, 0.0]
    assert metrics["reward/w/errors"] == 1.0


def test_empty_batch_and_empty_config():
    c = RewardComposer.from_config({})
    b = c.compose(traj([1.0]))
    assert b.total == 0.0 and b.turn_rewards == [0.0]
    bds, metrics = composer(a=(Const(), 1.0)).compose_batch([])
    assert bds == [] and metrics["reward/a/mean"] == 0.0


# ------------------------------------------------------------------------------------ env=mix sources' own rewards
class Batched:
    """A batched scorer that records which trajectories it was handed."""

    def __init__(self):
        self.seen: list[list[str]] = []

    def compute(self, trajectory):
        raise AssertionError("scored one at a time")

    def compute_batch(self, trajectories):
        self.seen.append([t.task["source"] for t in trajectories])
        return [len(t.turns) * 10.0 for t in trajectories]


def test_a_source_with_its_own_components_is_scored_by_them_alone_and_the_rest_by_the_runs():
    batched = Batched()
    comp = RewardComposer.from_config({"goal": {"name": "goal", "weight": 1.0}},
                                      by_source={"legs": {"score": {"name": "goal", "weight": 2.0,
                                                                    "kwargs": {"use_score": True}}}})
    comp = RewardComposer([*comp.specs, ComponentSpec("count", "batched", 1.0, batched, source="door")])
    door = traj(rewards=(0.0, 1.0), success=True, task={"source": "door"})
    legs = traj(rewards=(0.25,), success=False, task={"source": "legs", "score": 0.25})
    other = traj(rewards=(1.0,), success=True, task={"source": "copy"})
    (b_door, b_legs, b_other), metrics = comp.compose_batch([door, legs, other])
    assert comp.labels == ["goal", "legs.score", "count"]
    assert b_legs.parts == {"legs.score": 2.0 * 0.25} and b_legs.total == 0.5 and b_legs.turn_rewards == [0.5]
    assert b_door.parts == {"count": 20.0} and b_door.turn_rewards == [0.0, 20.0]  # not the run's goal
    assert b_other.parts == {"goal": 1.0}  # a source without components of its own: the run's
    assert batched.seen == [["door"]]  # a batched component is handed its source's trajectories only
    assert metrics["reward/goal/mean"] == 1.0 and metrics["reward/legs.score/mean"] == 0.5
    assert metrics["reward/count/mean"] == 20.0 and metrics["reward/legs.score/errors"] == 0.0
    _, only_legs = comp.compose_batch([legs])
    assert "reward/goal/mean" not in only_legs and "reward/count/mean" not in only_legs


def test_without_sources_every_component_scores_every_trajectory_as_before():
    comp = RewardComposer.from_config({"goal": {"name": "goal"}}, by_source={})
    (b,), metrics = comp.compose_batch([traj(rewards=(1.0,), success=True, task={"source": "legs"})])
    assert b.parts == {"goal": 1.0} and metrics["reward/goal/mean"] == 1.0
