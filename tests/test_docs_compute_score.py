"""docs/use.md (the rewards a run composes) and docs/writing-plugins.md give the one ``compute_score`` signature the
code calls, and say what ``solution_str`` holds; the guide's test step names the install that brings pytest."""

import re
from pathlib import Path

from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.rewards.components import FunctionReward

REPO = Path(__file__).resolve().parents[1]
SIGNATURE = "compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"


def _text(name: str) -> str:
    return re.sub(r"\s+", " ", (REPO / name).read_text())  # the pages wrap the signature across lines


def test_the_use_page_and_guide_give_the_signature_the_code_calls():
    for doc in ("docs/use.md", "docs/writing-plugins.md"):
        text = _text(doc)
        signatures = set(re.findall(r"compute_score\([^)]*\)", text))
        assert signatures == {SIGNATURE}, (doc, signatures)
        assert "`solution_str` is the last reply only (`trajectory.final_response`)" in text, doc
        assert "a function with a `trajectory` parameter also gets the whole" in text.lower(), doc


def test_the_documented_signature_gets_the_last_reply_and_the_task_fields_by_keyword():
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        seen.append((data_source, solution_str, ground_truth, extra_info, sorted(kwargs)))
        return float(solution_str == ground_truth)

    def with_trajectory(solution_str, ground_truth, trajectory):
        seen.append(trajectory.num_turns)
        return 0.0

    turns = [Turn(text, ParsedAction("action", text, True), "ok", 0.0, False, {}, (0, 1)) for text in ("7", "42")]
    traj = Trajectory(task_id=0, seed=0, group_id=0, initial_observation="q", turns=turns,
                      task={"data_source": "gsm8k", "ground_truth": "42", "extra_info": {"split": "test"}})
    assert FunctionReward(compute_score).compute(traj) == 1.0
    assert FunctionReward(with_trajectory).compute(traj) == 0.0
    assert seen == [("gsm8k", "42", "42", {"split": "test"}, []), 2]


def test_the_guide_names_the_install_that_brings_pytest():
    text = _text("docs/writing-plugins.md")
    step = text[text.index("## 4. Test it"):text.index("## 5.")]
    assert "`make install-test`" in step and "`pytest omrl-countdown/tests`" in step
