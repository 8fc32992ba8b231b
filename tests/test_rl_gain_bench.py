"""bench/rl_gain.py's budget arithmetic (issue 45), on made-up numbers: no training runs."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("rl_gain", Path(__file__).parents[1] / "bench" / "rl_gain.py")
rl_gain = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rl_gain)


def test_filtered_bc_gets_filtered_grpos_seconds_at_the_filtered_warmups_rate():
    # filtered warm-up: 300 steps in 121 s; filtered_grpo's budget: 121 s + 41 s of RL = 162 s -> 300 * 162 / 121
    assert rl_gain.scaled_steps(300, 121.0, 121.0 + 41.0) == 402
    # a slower filtered warm-up (0.5 s a step) gives the same budget fewer steps
    assert rl_gain.scaled_steps(300, 150.0, 162.0) == 324


def test_no_rl_budget_leaves_the_steps_unchanged():
    assert rl_gain.scaled_steps(300, 333.0, 333.0) == 300


@pytest.mark.parametrize("methods, needed", [
    (["filtered_bc", "filtered_grpo"], False),
    (["filtered_grpo"], False),
    (["filtered_bc"], True),  # alone it takes the warm-up's rate and budget, as before
    (["sft", "filtered_bc", "grpo", "filtered_grpo"], True),
    (["opd"], True),
])
def test_the_warmup_on_all_demonstrations_runs_only_when_a_method_needs_it(methods, needed):
    assert rl_gain.needs_full_warmup(methods) is needed


def test_rl_overrides_are_parsed_apart_from_the_others(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(rl_gain, "one_seed", lambda args, seed, extra, tmp: seen.update(rl=args.rl, extra=extra))
    monkeypatch.setattr(rl_gain, "table", lambda results, args: None)
    monkeypatch.setattr("sys.argv", ["rl_gain.py", "--seeds", "3", "--methods", "filtered_bc,filtered_grpo",
                                     "--keep", str(tmp_path), "env.val_tasks=120", "--rl",
                                     "trainer.total_steps=60", "actor.lr=2e-4"])
    rl_gain.main()
    assert seen == {"rl": ["trainer.total_steps=60", "actor.lr=2e-4"], "extra": ["env.val_tasks=120"]}
