"""Function-style scorers: known values (hand-computed, or sacrebleu's own documented test values), bad ground
truths, and their use through the registry and the composer (errors counted, the batch goes on)."""

from __future__ import annotations

import math

import pytest

from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rewards.components import FunctionReward
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.testing import check_reward
from openmanus_rl_scorers import (
    bleu,
    exact_match,
    extract_number,
    math_answer,
    normalize_answer,
    parse_number,
    token_f1,
)


def traj(reply: str, ground_truth=None, valid: bool = True, content: str | None = None, task_id: int = 0,
         **task) -> Trajectory:
    action = ParsedAction("action" if valid else "invalid", reply if content is None else content, valid)
    t = Trajectory(task_id=task_id, seed=0, group_id=0, initial_observation="What is 17 + 25?",
                   turns=[Turn(reply, action, "", 0.0, True, {}, (0, 4))], response_length=4)
    t.task = {"ground_truth": ground_truth, **task}
    return t


# ------------------------------------------------------------------------------------------ exact match
def test_normalize_answer_is_squad_style():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("  Theatre  ") == "theatre"  # 'the' only as a whole word
    assert normalize_answer("") == ""


@pytest.mark.parametrize("answer, truth, expected", [
    ("Paris", "paris", 1.0),
    ("The Eiffel Tower!", "eiffel tower", 1.0),
    ("  a   cat ", "The cat.", 1.0),
    ("Paris, France", "Paris", 0.0),
    ("42", 42, 1.0),               # a numeric reference is compared as its text
    ("0.5", 0.5, 1.0),
    ("rome", ["Paris", "Rome"], 1.0),  # best over several references
    ("", "", 1.0),
    ("", "x", 0.0),
])
def test_exact_match_known_values(answer, truth, expected):
    assert exact_match(answer, truth) == expected


# ---------------------------------------------------------------------------------------------- token F1
def test_token_f1_hand_computed():
    # "the cat sat" -> [cat, sat]; "a cat sat down" -> [cat, sat, down]; shared 2.
    # P = 2/2 = 1, R = 2/3, F1 = 2 * 1 * (2/3) / (1 + 2/3) = (4/3) / (5/3) = 0.8
    out = token_f1("the cat sat", "a cat sat down")
    assert out["precision"] == pytest.approx(1.0)
    assert out["recall"] == pytest.approx(2 / 3)
    assert out["score"] == pytest.approx(0.8)


def test_token_f1_more_known_values():
    # repeated tokens count as a multiset: [to, be, or, not, to, be] vs [to, be]: shared 2 (to, be);
    # P = 2/6, R = 2/2 = 1, F1 = 2 * (1/3) * 1 / (4/3) = 0.5
    assert token_f1("to be or not to be", "to be")["score"] == pytest.approx(0.5)
    assert token_f1("blue", "red")["score"] == 0.0
    assert token_f1("The Cat!", "cat")["score"] == 1.0
    assert token_f1("", "")["score"] == 1.0          # SQuAD v2: both empty agree
    assert token_f1("the", "cat")["score"] == 0.0    # only an article: empty after normalising
    # best over references: "cat sat" vs "cat" -> P 1/2, R 1, F1 2/3; vs "cat sat" -> 1
    assert token_f1("cat sat", ["cat", "cat sat"])["score"] == 1.0
    assert token_f1("cat sat", ["cat"])["score"] == pytest.approx(2 / 3)


# -------------------------------------------------------------------------------------------------- BLEU
# sacrebleu's own sentence-BLEU test values (test/test_sentence_bleu.py: 13a tokens, exp smoothing, effective
# order), and the ones its BLEU examples list for "this is a fest"/"another test" against "this is a test".
@pytest.mark.parametrize("hyp, ref, expected", [
    ("Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;",
     "producţia de zahăr brut se exprimă în zahăr alb;", 8.493),
    ("this is a cat", "okay thanks", 0.0),
    ("this is a fest", "this is a test", 59.460),
    ("another test", "this is a test", 18.394),
    ("this is a test", "this is a test", 100.0),
])
def test_bleu_matches_sacrebleu_documented_values(hyp, ref, expected):
    out = bleu(hyp, ref)
    assert 0.0 <= out["score"] <= 1.0
    assert out["score"] == pytest.approx(expected / 100, abs=1e-5)


def test_bleu_hand_computed_brevity_penalty():
    # "the cat" vs "the cat sat on the mat": with effective order only 1- and 2-grams count, both precisions are
    # 1 (2/2, 1/1), so BLEU = BP = exp(1 - 6/2) = exp(-2).
    out = bleu("the cat", "the cat sat on the mat")
    assert out["brevity_penalty"] == pytest.approx(math.exp(-2))
    assert out["score"] == pytest.approx(math.exp(-2), abs=1e-6)


def test_bleu_uses_all_references_and_options():
    refs = ["The dog bit the man.", "The dog had bit the man."]
    assert bleu("The dog bit the man.", refs)["score"] == pytest.approx(1.0)
    assert bleu("THIS IS A TEST", "this is a test", lowercase=True)["score"] == pytest.approx(1.0)
    assert bleu("THIS IS A TEST", "this is a test")["score"] < 0.1
    with pytest.raises(ValueError, match="bleu"):
        bleu("a", "a", tokenize="no-such-tokenizer")


# --------------------------------------------------------------------------------------------- math answer
@pytest.mark.parametrize("text, value", [
    ("17 + 25 = 42", 42.0),
    ("The answer is \\boxed{42}.", 42.0),
    ("first \\boxed{1} then \\boxed{7}", 7.0),
    ("so \\boxed{\\frac{3}{4}} (or 0.8?)", 0.75),
    ("$\\boxed{-\\dfrac{1}{2}}$", -0.5),
    ("\\boxed{x = 5}", 5.0),
    ("\\boxed 42", 42.0),
    ("It costs $1,234.50 in total", 1234.5),
    ("x = -3/4", -0.75),
    ("-5 degrees", -5.0),
    ("17-5", 5.0),          # a hyphen between digits is not a minus sign
    ("about 3.14.", 3.14),
    ("no number here", None),
    ("", None),
])
def test_extract_number(text, value):
    assert extract_number(text) == value


@pytest.mark.parametrize("text, value", [
    ("42", 42.0), (" -7 ", -7.0), ("$1,000", 1000.0), ("3/4", 0.75), ("\\frac{1}{8}", 0.125), ("2.50", 2.5),
    ("Paris", None), ("42 apples and 3 pears", None), ("1/0", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("reply, truth, score, found", [
    ("42", "42", 1.0, 1.0),
    ("The sum is 42.", 42, 1.0, 1.0),
    ("\\boxed{42}", "42", 1.0, 1.0),
    ("41", "42", 0.0, 1.0),
    ("I don't know", "42", 0.0, 0.0),
    ("$1,234", "1234", 1.0, 1.0),
    ("0.75", "3/4", 1.0, 1.0),
    ("3/4", 0.75, 1.0, 1.0),
    ("-12", "-12", 1.0, 1.0),
    ("12", "-12", 0.0, 1.0),
    ("0.333333", "1/3", 0.0, 1.0),         # off by 3.3e-7 > the tight tolerances used here
    ("He pays 18 dollars.\n#### 18", "Natalia sold ... #### 18", 1.0, 1.0),  # GSM8K-style reference
    ("42.0", "\\boxed{42}", 1.0, 1.0),
])
def test_math_answer_known_values(reply, truth, score, found):
    out = math_answer(reply, truth, rel_tol=1e-7, abs_tol=1e-9)
    assert out == {"score": score, "answer_found": found}


def test_math_answer_tolerance_and_format_score():
    assert math_answer("0.333333", "1/3")["score"] == 1.0             # default rel_tol 1e-4
    assert math_answer("0.33", "1/3")["score"] == 0.0
    assert math_answer("0.33", "1/3", abs_tol=0.01)["score"] == 1.0
    assert math_answer("41", "42", format_score=0.1) == {"score": 0.1, "answer_found": 1.0}
    assert math_answer("none", "42", format_score=0.1) == {"score": 0.0, "answer_found": 0.0}


# ------------------------------------------------------------------------------------------ bad ground truth
@pytest.mark.parametrize("scorer", [exact_match, token_f1, bleu, math_answer])
def test_wrong_type_ground_truth_names_scorer_and_value(scorer):
    name = scorer.__name__
    with pytest.raises(TypeError, match=rf"{name}.*\{{'answer': 42\}}"):
        scorer("42", {"answer": 42})
    with pytest.raises(ValueError, match=rf"{name}.*no ground truth"):
        scorer("42", None)
    with pytest.raises(TypeError, match=name):
        scorer("42", True)


def test_math_answer_non_numeric_ground_truth():
    with pytest.raises(ValueError, match=r"math_answer: ground truth 'Paris' is not a number"):
        math_answer("42", "Paris")
    with pytest.raises(TypeError, match=r"math_answer.*list"):
        math_answer("42", ["42"])


def test_text_scorer_rejects_bad_reference_list_and_answer_from():
    with pytest.raises(TypeError, match=r"token_f1.*dict"):
        token_f1("a", ["a", {"b": 1}])
    with pytest.raises(ValueError, match="exact_match.*empty"):
        exact_match("a", [])
    with pytest.raises(ValueError, match="answer_from"):
        exact_match("a", "a", answer_from="whatever")


# ------------------------------------------------------------------------------------- through the trajectory
def test_scores_the_parsed_action_by_default_and_the_reply_on_request():
    t = traj("<think>easy</think><action>Paris</action>", "paris", content="Paris")
    fr = FunctionReward(exact_match)
    assert fr.compute(t) == 1.0                                   # the parsed action, markup gone
    assert FunctionReward(exact_match, answer_from="response").compute(t) == 0.0
    # an unparseable reply: the raw text is scored
    bad = traj("paris", "Paris", valid=False)
    assert fr.compute(bad) == 1.0
    # math: the action's number, not a number from the thought
    m = traj("<think>17 + 25</think><action>42</action>", "42", content="42")
    assert FunctionReward(math_answer).compute(m)["score"] == 1.0
    # the verl layout: reward_model.ground_truth
    v = traj("<action>42</action>", None, content="42", reward_model={"ground_truth": "42", "style": "rule"})
    assert FunctionReward(math_answer).compute(v)["score"] == 1.0


@pytest.mark.parametrize("name", ["exact_match", "token_f1", "bleu", "math_answer"])
def test_registered_as_plain_functions_and_conform(name):
    entry = next(e for e in registry("reward").entries() if e.name == name)
    assert entry.dist == "openmanus-rl-reward-scorers"
    fn = registry("reward").get(name)
    assert callable(fn) and not isinstance(fn, type) and not hasattr(fn, "compute")
    trajs = [traj("<action>42</action>", "42", content="42"), traj("<action>7</action>", "42", content="7", task_id=1)]
    composer = RewardComposer.from_config({"s": {"name": name, "weight": 1.0}})
    check_reward(composer.specs[0].component, trajs)


def test_composer_counts_a_failing_sample_and_goes_on(caplog):
    """A scorer raising on one sample (a dict ground truth, a non-numeric one): that sample scores 0, the error is
    counted in reward/<label>/errors, the others are scored normally."""
    composer = RewardComposer.from_config({
        "answer": {"name": "math_answer", "weight": 1.0},
        "em": {"name": "exact_match", "weight": 0.5},
    })
    batch = [
        traj("<action>42</action>", "42", content="42", task_id=0),
        traj("<action>42</action>", {"answer": 42}, content="42", task_id=1),   # wrong type for both scorers
        traj("<action>Paris</action>", "Paris", content="Paris", task_id=2),    # not a number: math_answer only
        traj("<action>41</action>", "42", content="41", task_id=3),
    ]
    with caplog.at_level("WARNING"):
        breakdowns, metrics = composer.compose_batch(batch)
    assert [b.total for b in breakdowns] == [1.5, 0.0, 0.5, 0.0]
    assert metrics["reward/answer/errors"] == 2.0
    assert metrics["reward/em/errors"] == 1.0
    assert metrics["reward/answer/mean"] == pytest.approx(1 / 4)
    assert metrics["reward/em/mean"] == pytest.approx(0.5 * 2 / 4)
    assert metrics["reward/answer/answer_found/mean"] == 1.0       # over the samples that returned extras
    assert "TypeError" in breakdowns[1].errors["answer"] and "math_answer" in breakdowns[1].errors["answer"]
    assert "not a number" in breakdowns[2].errors["answer"]
    logged = caplog.text
    assert "task_id=1" in logged and "math_answer" in logged        # the row and the scorer, logged once
