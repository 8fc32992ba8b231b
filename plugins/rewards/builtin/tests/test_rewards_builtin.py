"""Built-in reward components: hand-computed values, properties, configs, and the registry."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from openmanus_rl_core.protocols import ParsedAction, RewardComponent, Trajectory, Turn
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.testing import check_reward
from openmanus_rl_rewards.components import (
    FormatReward,
    GoalReward,
    InvalidActionPenalty,
    LengthPenalty,
    ProcessReward,
)

CONFIGS = Path(__file__).resolve().parents[1] / "openmanus_rl_rewards" / "configs" / "reward"
NAMES = {"goal": GoalReward, "length_penalty": LengthPenalty, "format": FormatReward,
         "invalid_action": InvalidActionPenalty, "process": ProcessReward}


def turn(response="<action>go</action>", valid=True, reward=0.0, info=None, span=(0, 0)) -> Turn:
    return Turn(response=response, action=ParsedAction("action" if valid else "invalid", "go", valid),
                observation="ok", reward=reward, done=False, info=dict(info or {}), span=span)


def traj(turns=(), success=None) -> Trajectory:
    return Trajectory(task_id=1, seed=0, group_id=0, initial_observation="start", turns=list(turns), success=success)


def spans(lengths, gap=3):
    """Consecutive agent spans of the given lengths separated by `gap` observation tokens."""
    out, pos = [], 0
    for n in lengths:
        out.append((pos, pos + n))
        pos += n + gap
    return out


# ---------------------------------------------------------------------------------------------- goal
def test_goal_success_sources():
    g = GoalReward()
    assert g.compute(traj([turn()], success=True)) == 1.0
    assert g.compute(traj([turn()], success=False)) == 0.0
    assert g.compute(traj([turn(info={"success": True})])) == 1.0  # success unset: last turn's info
    assert g.compute(traj([turn(info={"success": True}), turn()])) == 0.0  # only the last turn counts
    assert g.compute(traj([turn(info={"success": True})], success=False)) == 0.0  # trajectory wins
    assert g.compute(traj([])) == 0.0


def test_goal_use_score():
    g = GoalReward(use_score=True)
    assert g.compute(traj([turn(reward=0.5), turn(reward=0.25)])) == 0.75  # env reward sum
    assert g.compute(traj([turn(reward=0.5), turn(reward=0.25, info={"score": 0.6})])) == 0.6
    assert g.compute(traj([])) == 0.0


# ------------------------------------------------------------------------------------ length_penalty
def test_length_penalty_hand_values():
    t = traj([turn(span=s) for s in spans([10, 30])])  # 40 agent tokens, 2 turns
    assert LengthPenalty("linear", max_length=100).compute(t) == pytest.approx(-0.4)
    assert LengthPenalty("quadratic", max_length=100, scale=2.0).compute(t) == pytest.approx(-2 * 0.16)
    assert LengthPenalty("log", max_length=100).compute(t) == pytest.approx(-math.log(1.4) / math.log(2))
    assert LengthPenalty("linear", scale=0.01).compute(t) == pytest.approx(-0.4)  # raw tokens
    assert LengthPenalty("log").compute(t) == pytest.approx(-math.log(41))
    assert LengthPenalty("linear", unit="turns", max_length=4).compute(t) == pytest.approx(-0.5)
    assert LengthPenalty("linear", unit="chars").compute(traj([turn("abc")])) == -3.0
    # Clipped at max_length: every kind bottoms out at -scale.
    for kind in LengthPenalty.KINDS:
        assert LengthPenalty(kind, max_length=20, scale=0.5).compute(t) == pytest.approx(-0.5)


@pytest.mark.parametrize("kind", LengthPenalty.KINDS)
def test_length_penalty_zero_at_zero(kind):
    assert LengthPenalty(kind).compute(traj([])) == 0.0
    assert LengthPenalty(kind, max_length=10).compute(traj([turn(span=(0, 0))])) == 0.0


@settings(max_examples=50, deadline=None)
@given(a=st.integers(0, 500), b=st.integers(0, 500), kind=st.sampled_from(LengthPenalty.KINDS),
       max_length=st.one_of(st.none(), st.integers(1, 300)))
def test_length_penalty_monotone_and_nonpositive(a, b, kind, max_length):
    p = LengthPenalty(kind, max_length=max_length)
    short, long_ = sorted([a, b])
    vs = p.compute(traj([turn(span=(0, short))])), p.compute(traj([turn(span=(0, long_))]))
    assert vs[1] <= vs[0] <= 0.0
    if max_length:
        assert vs[1] >= -1.0 - 1e-12


def test_length_penalty_bad_options():
    with pytest.raises(ValueError, match="unknown kind 'cubic'.*linear, quadratic, log"):
        LengthPenalty("cubic")
    with pytest.raises(ValueError, match="unknown unit 'words'.*tokens, turns, chars"):
        LengthPenalty(unit="words")
    with pytest.raises(ValueError, match="max_length"):
        LengthPenalty(max_length=0)
    with pytest.raises(ValueError, match="scale"):
        LengthPenalty(scale=-1)


# -------------------------------------------------------------------------------------------- format
def test_format_requires_reply_to_end_after_action():
    f = FormatReward()
    good = turn("<think>hm</think><action>go</action>\n  ")
    spam = turn("<action>go</action> <action>north</action> also maybe south")
    invalid = turn("no tags at all", valid=False)
    t = traj([good, spam, invalid, good])
    assert f.compute(t) == 0.5
    assert f.compute_turns(t) == [0.25, 0.0, 0.0, 0.25]
    assert FormatReward(require_end=False).compute(t) == 0.75
    assert FormatReward(end_pattern=None).compute(t) == 0.75
    assert FormatReward(end_pattern=r"\}\s*$").compute(traj([turn('{"tool": "x"}')])) == 1.0
    assert f.compute(traj([])) == 0.0 and f.compute_turns(traj([])) == []


def test_format_bad_pattern():
    with pytest.raises(ValueError, match="end_pattern"):
        FormatReward(end_pattern="(")


class OwnTemplate:
    """A user's own template: ``DO: <action> END`` replies, generation stopped at ``END``."""

    stop = [" END"]
    end_pattern = r"DO: [^\n]+ END\s*$"

    def system_prompt(self, instruction: str) -> str:
        return f"{instruction}\nReply as DO: <action> END"

    def parse(self, text: str) -> ParsedAction:
        found = re.search(r"DO: (.+?) END", text)
        return ParsedAction("action", found.group(1), True) if found else ParsedAction("invalid", text, False)

    def render(self, action: str, thought: str = "") -> str:
        return f"{thought} DO: {action} END".strip()


class SilentTemplate(OwnTemplate):
    """The same replies, from a template that does not say what a well-formed reply ends with."""

    end_pattern = None


def composer_with(template, **format_kwargs) -> RewardComposer:
    """The shipped default reward (its format kwargs updated), composed as trainer_setup composes it."""
    from openmanus_rl_core.config.loading import load

    components = load([]).reward.components
    components["format"]["kwargs"].update(format_kwargs)
    return RewardComposer.from_config(components, template=template)


def format_of(composer: RewardComposer, template, *replies: str) -> float:
    """The unweighted ``format`` value of one episode whose replies are ``replies``, parsed by ``template``."""
    turns = [Turn(response=r, action=template.parse(r), observation="ok", reward=0.0, done=False, info={})
             for r in replies]
    return composer.compose(traj(turns)).raw["format"]


def test_default_reward_leaves_the_format_end_pattern_to_the_template():
    cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / "default.yaml"))
    assert "end_pattern" not in cfg["components"]["format"]["kwargs"]


def test_format_scores_a_users_own_template_by_its_end_pattern():
    own = OwnTemplate()
    composer = composer_with(own)
    assert format_of(composer, own, "DO: open box END", "so DO: go north END\n") == 1.0
    # Valid, but the reply runs on after the action: not well formed by the template's own pattern.
    assert format_of(composer, own, "DO: open box END", "DO: go north END and DO: south") == 0.5
    assert format_of(composer, own, "no action here") == 0.0


def test_format_with_a_template_that_says_nothing_counts_valid_actions():
    silent = SilentTemplate()
    assert format_of(composer_with(silent), silent, "DO: go north END and DO: south", "nothing") == 0.5


@pytest.mark.parametrize("name,kwargs", [
    ("react", {}), ("react", {"action_tag": "act", "think": False}), ("json_tool", {}), ("json_tool", {"tags": False}),
    ("agentgym", {}), ("agentgym", {"action_on_new_line": True}), ("agentgym", {"multiline": True}),
])
def test_format_scores_each_builtin_templates_own_replies_1(name, kwargs):
    template = registry("template").build(name, **kwargs)
    composer = composer_with(template)
    replies = [template.render("open box"), template.render("go north", thought="the door is shut")]
    # As the engine returns a reply: generation stopped at a stop string, which it keeps.
    replies += [r + template.stop[0] for r in replies if template.stop and not r.endswith(template.stop[0])]
    assert format_of(composer, template, *replies) == 1.0
    run_on = template.render("open box") + "\nand maybe go north, or south"
    assert format_of(composer, template, run_on) == (1.0 if kwargs.get("multiline") else 0.0)


def test_format_explicit_end_pattern_wins_over_the_template():
    react = registry("template").build("react")
    braces = composer_with(react, end_pattern=r"\}\s*$")
    assert format_of(braces, react, "<action>go</action>", "<action>go</action> {}") == 0.5
    run_on = "<action>go</action> and <action>north</action> maybe"
    assert format_of(composer_with(react, end_pattern=None), react, run_on) == 1.0
    assert format_of(composer_with(react, require_end=False), react, run_on) == 1.0
    assert format_of(composer_with(react), react, run_on) == 0.0


# ------------------------------------------------------------------------------------ invalid_action
def test_invalid_action_penalty():
    t = traj([turn(valid=False), turn(), turn(info={"invalid": True}), turn()])
    p = InvalidActionPenalty()
    assert p.compute(t) == -0.5
    assert p.compute_turns(t) == [-0.25, 0.0, -0.25, 0.0]
    assert InvalidActionPenalty(normalize=False).compute(t) == -2.0
    assert InvalidActionPenalty(normalize=False).compute_turns(t) == [-1.0, 0.0, -1.0, 0.0]
    assert p.compute(traj([])) == 0.0


@settings(max_examples=50, deadline=None)
@given(flags=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=12))
def test_invalid_action_in_range(flags):
    t = traj([turn(valid=v, info={"invalid": inv}) for v, inv in flags])
    value = InvalidActionPenalty().compute(t)
    assert -1.0 <= value <= 0.0
    assert sum(InvalidActionPenalty().compute_turns(t)) == pytest.approx(value)
    assert 0.0 <= FormatReward().compute(t) <= 1.0


# ------------------------------------------------------------------------------------------- process
def test_process_modes():
    t = traj([turn(reward=1.0), turn(reward=0.0), turn(reward=2.0)])
    assert ProcessReward("sum").compute(t) == 3.0
    assert ProcessReward("sum").compute_turns(t) == [1.0, 0.0, 2.0]
    assert ProcessReward("discounted", gamma=0.5).compute(t) == 1.0 + 0.25 * 2.0
    assert ProcessReward("discounted", gamma=0.5).compute_turns(t) == [1.0, 0.0, 0.5]
    assert ProcessReward("last").compute(t) == 2.0
    assert ProcessReward("last").compute_turns(t) == [0.0, 0.0, 2.0]
    for mode in ProcessReward.MODES:
        assert ProcessReward(mode).compute(traj([])) == 0.0 and ProcessReward(mode).compute_turns(traj([])) == []
    with pytest.raises(ValueError, match="unknown mode 'mean'.*sum, discounted, last"):
        ProcessReward("mean")
    with pytest.raises(ValueError, match="gamma"):
        ProcessReward("discounted", gamma=0)


@settings(max_examples=50, deadline=None)
@given(rewards=st.lists(st.floats(-10, 10), max_size=10), mode=st.sampled_from(ProcessReward.MODES),
       gamma=st.floats(0.01, 1.0))
def test_process_turns_sum_to_compute(rewards, mode, gamma):
    t = traj([turn(reward=r) for r in rewards])
    p = ProcessReward(mode, gamma=gamma)
    assert len(p.compute_turns(t)) == len(rewards)
    assert sum(p.compute_turns(t)) == pytest.approx(p.compute(t))


def test_process_with_per_turn_allocator_lands_on_turn_tokens():
    """End to end: process reward -> composer turn split -> per_turn allocator."""
    alloc = pytest.importorskip("openmanus_rl_allocators.allocators").PerTurnAllocator()
    segs = spans([2, 3, 2])
    t = traj([turn(reward=r, span=s) for r, s in zip([1.0, 0.0, 2.0], segs)])
    bd = RewardComposer.from_config({"process": {"weight": 0.5}}).compose(t)
    tokens = alloc(bd.total, bd.turn_rewards, segs, segs[-1][1])
    assert segs == [(0, 2), (5, 8), (11, 13)]
    assert tokens == [0, 0.5, 0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 1.0]  # turn i's reward on its last token


# ------------------------------------------------------------------------------ registry and configs
@pytest.mark.parametrize("name", sorted(NAMES))
def test_registered_and_conform(name):
    cls = registry("reward").get(name)
    assert cls is NAMES[name]
    comp = registry("reward").build(name)
    assert isinstance(comp, RewardComponent)
    sample = traj([turn(reward=0.5, span=(0, 3)), turn(valid=False, reward=1.0, span=(5, 6))], success=True)
    value = comp.compute(sample)
    assert isinstance(value, float) and math.isfinite(value)
    if hasattr(comp, "compute_turns"):
        assert sum(comp.compute_turns(sample)) == pytest.approx(value)
    check_reward(comp)
    check_reward(comp, [sample])


OPTION_VARIANTS = {  # test id -> component (an id must be the same in every process: xdist's workers compare them)
    "goal-use_score": GoalReward(use_score=True),
    "length-quadratic-turns-max3": LengthPenalty("quadratic", unit="turns", max_length=3),
    "length-log-chars": LengthPenalty("log", unit="chars"), "format-no-require_end": FormatReward(require_end=False),
    "invalid_action-not-normalized": InvalidActionPenalty(normalize=False),
    "process-discounted-0.5": ProcessReward("discounted", gamma=0.5), "process-last": ProcessReward("last"),
}


@pytest.mark.parametrize("comp", list(OPTION_VARIANTS.values()), ids=list(OPTION_VARIANTS))
def test_option_variants_conform(comp):
    check_reward(comp)


@pytest.mark.parametrize("option", ["default", "goal", "process"])
def test_shipped_configs_build(option):
    cfg = OmegaConf.load(CONFIGS / f"{option}.yaml")
    composer = RewardComposer.from_config(cfg.components)
    bd = composer.compose(traj([turn(reward=1.0, span=(0, 2))], success=True))
    assert math.isfinite(bd.total)
    assert bd.total == pytest.approx({"default": 1.1, "goal": 1.0, "process": 1.0}[option])


def test_default_config_weights():
    cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / "default.yaml"))
    assert {k: v["weight"] for k, v in cfg["components"].items()} == {"goal": 1.0, "format": 0.1,
                                                                      "invalid_action": 0.1}


def test_hook_contributes_config_dir():
    from openmanus_rl_rewards import hooks

    (d,) = hooks.openmanus_rl_config_dirs()
    assert (Path(d) / "reward" / "default.yaml").is_file()


# ---------------------------------------------------------------------------------------------- overlong
def test_overlong_soft_penalty_by_hand():
    from openmanus_rl_rewards.components import OverlongPenalty

    pen = OverlongPenalty(max_length=40, buffer_frac=0.25)  # buffer 10: penalty starts after 30 tokens
    assert [pen.penalty(n) for n in (0, 30, 31, 35, 40, 41)] == pytest.approx([0.0, 0.0, -0.1, -0.5, -1.0, -1.0])
    # Two replies of 35 and 10 tokens: -0.5 on the first turn, 0 on the second, each / T.
    t = traj([turn(span=(0, 35)), turn(span=(38, 48))])
    assert pen.compute_turns(t) == pytest.approx([-0.25, 0.0])
    assert pen.compute(t) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="1.5"):
        OverlongPenalty(max_length=40, buffer_frac=1.5)
    with pytest.raises(ValueError, match="'40'"):
        OverlongPenalty(max_length="40")


def test_overlong_config_adds_to_the_default_reward():
    from openmanus_rl_core.config.loading import compose

    cfg = compose(["reward=overlong", "rollout.max_new_tokens=24"])
    comps = cfg.reward.components
    assert {"goal", "format", "invalid_action", "overlong"} <= set(comps)
    assert comps["overlong"]["kwargs"]["max_length"] == 24
