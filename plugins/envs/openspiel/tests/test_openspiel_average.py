"""The run's average policy (average.py): one table that plays as a checkpoint drawn at the start of each game
does, in value against any opponent and in exploitability; a training run's validations report its exploitability
from the first step after the warm-up (``eval`` and step 0 do not), and a checkpoint keeps its tables up to its step,
which a resume puts back exactly."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pyspiel
import pytest
from open_spiel.python.algorithms import expected_game_score, exploitability

from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.models.scoring import PolicyScorer
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_env_openspiel import hooks
from openmanus_rl_env_openspiel.average import History, average_table
from openmanus_rl_env_openspiel.exploitability import as_openspiel, information_states

BET, PASS = 1, 0  # kuhn_poker's actions


def random_table(game, seed: int) -> dict:
    rng = random.Random(seed)
    table = {}
    for key, state in information_states(game).items():
        weights = {a: rng.random() for a in state.legal_actions()}
        table[key] = {a: w / sum(weights.values()) for a, w in weights.items()}
    return table


def always(game, action: int) -> dict:
    return {key: {a: float(a == action) for a in state.legal_actions()}
            for key, state in information_states(game).items()}


def value(game, seat0, seat1) -> float:
    return expected_game_score.policy_value(game.new_initial_state(), [seat0, seat1])[0]


def test_the_average_plays_as_a_checkpoint_drawn_for_each_game():
    """Against a fixed opponent in either seat, the average table's value is the mean of the tables' values (a
    mixture over whole games, not a per-decision mean: that differs in Leduc's second round)."""
    game = pyspiel.load_game("leduc_poker")
    tables = [random_table(game, s) for s in range(3)]
    mixed = as_openspiel(game, average_table(game, tables))
    opponent = as_openspiel(game, random_table(game, 9))
    seat0 = [value(game, as_openspiel(game, t), opponent) for t in tables]
    seat1 = [value(game, opponent, as_openspiel(game, t)) for t in tables]
    assert value(game, mixed, opponent) == pytest.approx(sum(seat0) / 3, abs=1e-9)
    assert value(game, opponent, mixed) == pytest.approx(sum(seat1) / 3, abs=1e-9)
    naive = {key: {a: sum(t[key][a] for t in tables) / 3 for a in probs} for key, probs in tables[0].items()}
    assert value(game, as_openspiel(game, naive), opponent) != pytest.approx(sum(seat0) / 3, abs=1e-4)
    alone = average_table(game, tables[:1])
    assert alone.keys() == tables[0].keys()
    assert all(alone[key] == pytest.approx(probs, abs=1e-12) for key, probs in tables[0].items())


def test_where_only_one_policy_goes_the_average_is_that_policy():
    """Kuhn, always Pass mixed with always Bet: half each at a seat's first move; after its own Pass and the other
    seat's Bet, only always-Pass gets there, so the average passes (folds) there as it does."""
    game = pyspiel.load_game("kuhn_poker")
    mixed = average_table(game, [always(game, PASS), always(game, BET)])
    assert mixed[(0, "0")] == {PASS: 0.5, BET: 0.5}  # player 0 holding the jack, first to move
    assert mixed[(0, "0pb")] == {PASS: 1.0, BET: 0.0}  # passed, then faced a bet
    assert mixed[(1, "1b")] == {PASS: 0.5, BET: 0.5}  # player 1 moves once: the plain mean
    with pytest.raises(ValueError, match="no policy to average"):
        average_table(game, [])


def test_training_validations_report_the_averages_exploitability_and_a_checkpoint_keeps_its_tables():
    game = pyspiel.load_game("kuhn_poker")
    tokenizer = build_tokenizer(["Game: kuhn_poker Pass Bet <action></action> player Legal actions"] * 4,
                                vocab_size=400)
    template = build("template", {"name": "react", "kwargs": {}})
    bet = tokenizer.encode("Bet", add_special_tokens=False)
    preference = {"bet": True}

    def score(prompts, continuations):  # every reply of the preferred action far likelier than the other's
        return [0.0 if any(t in c for t in bet) == preference["bet"] else -30.0 for c in continuations]

    cfg = SimpleNamespace(env=SimpleNamespace(name="openspiel", kwargs={"game": "kuhn_poker", "opponent": "self"}))
    scorer = PolicyScorer(tokenizer, template, score)
    hooks._TRAINING.clear()
    hooks._HISTORY.clear()
    assert "exploitability_average" not in hooks.openmanus_rl_policy_metrics(cfg=cfg, policy=scorer)  # eval
    hooks.openmanus_rl_run_start(cfg=None, run_dir="unused")
    assert "exploitability_average" not in hooks.openmanus_rl_policy_metrics(cfg=cfg, policy=scorer)  # step 0
    hooks.openmanus_rl_process_trajectories(trajectories=[], step=10)
    first = hooks.openmanus_rl_policy_metrics(cfg=cfg, policy=scorer)
    assert first["exploitability_average"] == pytest.approx(first["exploitability"], abs=1e-9)
    always_bet = exploitability.exploitability(game, as_openspiel(game, always(game, BET)))
    assert first["exploitability"] == pytest.approx(always_bet, abs=1e-6)
    preference["bet"] = False
    hooks.openmanus_rl_process_trajectories(trajectories=[], step=20)
    second = hooks.openmanus_rl_policy_metrics(cfg=cfg, policy=scorer)
    mixed = average_table(game, [always(game, BET), always(game, PASS)])
    assert second["exploitability_average"] == pytest.approx(
        exploitability.exploitability(game, as_openspiel(game, mixed)), abs=1e-6)
    assert second["exploitability_average"] != pytest.approx(second["exploitability"], abs=1e-3)  # not the last

    saved = hooks.openmanus_rl_checkpoint_save(cfg=cfg, run_dir="unused", step=15)
    assert list(saved) == [hooks.AVERAGE_KEY] and list(saved[hooks.AVERAGE_KEY]["tables"]) == [10]
    hooks.openmanus_rl_checkpoint_restore(cfg=cfg, run_dir="unused", step=15, state=saved)  # the resume
    assert list(hooks._HISTORY.tables) == [10]
    restored = hooks._HISTORY.tables[10]
    assert restored.keys() == always(game, BET).keys()
    for key, probs in always(game, BET).items():
        assert restored[key] == pytest.approx(probs, abs=1e-12)
    hooks.openmanus_rl_run_end(run_dir="unused", metrics={})
    assert hooks._HISTORY.tables == {} and hooks.openmanus_rl_checkpoint_save(cfg=cfg, run_dir="unused", step=30) is None


def test_history_saves_text_a_checkpoint_can_hold():
    history = History()
    history.add(5, {(0, "0"): {0: 0.25, 1: 0.75}})
    assert history.saved(4) == {} and isinstance(history.saved(5)[5], str)
