"""env=openspiel on the real OpenSpiel: what the seat to move is shown, the reward is OpenSpiel's return for the
seat, a task is the same deal and the same opponent everywhere, invalid replies are answered with the legal actions
and forfeit after ``invalid_limit``, the opponents (random, MCTS, minimax) play as they should, and bad settings are
one line before anything starts."""

from __future__ import annotations

import collections
import random
import re

import pyspiel
import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.testing import check_env
from openmanus_rl_env_openspiel import OpenSpielEnv, games


def legal(observation: str) -> list[str]:
    return re.search(r"^Legal actions: (.*)$", observation, re.MULTILINE).group(1).split(", ")


def play(env: OpenSpielEnv, task: int, choose) -> tuple[list[str], list]:
    """One episode; ``choose(observation) -> action``. Returns the observations and the step results."""
    seen, results = [env.reset(task_id=task)], []
    while True:
        results.append(env.step(choose(seen[-1])))
        seen.append(results[-1].observation)
        if results[-1].done:
            return seen, results


def test_conformance_kit_and_the_random_oracle():
    for game in ("kuhn_poker", "leduc_poker", "tic_tac_toe", "liars_dice"):
        check_env(lambda: OpenSpielEnv(game=game), task_ids=[0, 3, None], actions=["Bet", "Call", "x(1,1)", "Liar"])
    env = OpenSpielEnv(game="kuhn_poker", seat=0)
    firsts = collections.Counter()
    for task in range(200):  # the oracle plays legal moves, uniformly: the format, and no strategy
        env.reset(task_id=task)
        move = env.oracle_action()
        firsts[move] += 1
        assert not env.step(move).info["invalid"]
    assert set(firsts) == {"Pass", "Bet"} and 70 <= firsts["Bet"] <= 130, firsts
    again = OpenSpielEnv(game="kuhn_poker", seat=0)
    for task in range(10):  # a task's oracle moves are the same in a new env
        env.reset(task_id=task)
        again.reset(task_id=task)
        assert env.oracle_action() == again.oracle_action()


def test_the_seat_sees_its_card_the_public_moves_and_the_legal_actions_never_the_other_card():
    env = OpenSpielEnv(game="kuhn_poker")
    for task in range(12):
        first = env.reset(task_id=task)
        seat = task % 2
        state = env.state
        own_card, other_card = state.history()[seat], state.history()[1 - seat]
        lines = first.splitlines()
        assert lines[0] == f"Game: kuhn_poker. You are player {seat} of 2."
        assert lines[2] == state.information_state_string(seat) and lines[2][0] == str(own_card)
        assert str(other_card) not in lines[2]  # the other card (0, 1 or 2) appears nowhere in what the seat knows
        ranks = ["Jack", "Queen", "King"]
        assert lines[3] == f"Your card: {ranks[own_card]}" and ranks[other_card] not in first
        assert legal(first) == ["Pass", "Bet"]
        # seat 1 sees player 0's opening move; seat 0 opens
        expected = "none" if seat == 0 else f"player 0: {state.action_to_string(0, state.history()[2])}"
        assert lines[4] == f"Moves so far: {expected}"


def test_openspiels_bots_demonstrate_the_seat_for_the_warm_up():
    from openmanus_rl_core.config import ConfigError as Refused
    from openmanus_rl_core.run.warmup import demonstrator_policy

    env = OpenSpielEnv(game="tic_tac_toe", opponent="random")
    assert set(env.demonstrators) == {"bot:mcts", "bot:minimax"}
    minimax = demonstrator_policy(env, "bot:minimax")
    scores = []
    for task in range(20):  # perfect play never loses, in either seat, and wins most games against random moves
        _, results = play(env, task, lambda obs: minimax())
        assert not any(r.info["invalid"] for r in results)
        scores.append(results[-1].info["score"])
    assert min(scores) >= 0 and scores.count(1.0) >= 14, scores
    moves = []
    for fresh in (env, OpenSpielEnv(game="tic_tac_toe", opponent="random")):  # the bot is seeded by the task
        first = fresh.reset(task_id=1)
        moves.append(demonstrator_policy(fresh, "bot:mcts")())
    assert moves[0] == moves[1] and moves[0] in legal(first)
    poker = OpenSpielEnv(game="kuhn_poker")
    assert list(poker.demonstrators) == ["bot:mcts", "bot:cfr"]  # minimax cannot search a game of hidden cards
    with pytest.raises(Refused, match="bot:minimax: the env OpenSpielEnv offers oracle, bot:mcts, bot:cfr"):
        demonstrator_policy(poker, "bot:minimax")
    poker.reset(task_id=0)
    with pytest.raises(ValueError, match="demonstrator 'bot:minimax': openspiel \\(kuhn_poker\\) offers bot:mcts"):
        poker.demonstrator_action("bot:minimax")


def test_the_reward_is_the_seats_openspiel_return_and_a_task_is_the_same_deal():
    env = OpenSpielEnv(game="kuhn_poker")
    deals = collections.Counter()
    for task in range(60):
        seat = task % 2
        _, results = play(env, task, lambda obs: "Bet")
        returns = env.state.returns()
        deal = tuple(env.state.history()[:2])
        deals[deal] += 1
        assert results[-1].reward == returns[seat] == results[-1].info["score"]
        assert results[-1].info["success"] == (returns[seat] > 0) and sum(results[-1].info["returns"]) == 0
        assert all(r.reward == 0.0 for r in results[:-1])
        again = OpenSpielEnv(game="kuhn_poker")
        again.reset(task_id=task)
        assert tuple(again.state.history()[:2]) == deal  # the same task deals the same cards in a new env
    assert len(deals) == 6  # every deal of three cards to two players happens


def test_moves_are_read_by_their_text_case_and_spacing_ignored_and_the_board_is_shown():
    env = OpenSpielEnv(game="tic_tac_toe", seat=0, opponent="random")
    first = env.reset(task_id=0)
    # the board comes last, right before the reply: its cells are the observation's last tokens on every turn
    assert first.endswith("\nBoard (rows 0-2, columns 0 1 2):\n0: . . .\n1: . . .\n2: . . .")
    assert first.index("Legal actions: ") < first.index("State (as player 0 sees it):")
    assert legal(first)[0] == "x(0,0)"
    result = env.step("  X(1,1) ")
    assert not result.info["invalid"] and env.state.history()[0] == 4
    rows = result.observation.split("columns 0 1 2):\n", 1)[1].splitlines()[:3]
    cells = [row.split(": ", 1)[1].split(" ") for row in rows]
    assert [row.split(":")[0] for row in rows] == ["0", "1", "2"] and all(len(c) == 3 for c in cells)
    assert "Moves so far: player 0: x(1,1); player 1: o(" in result.observation and cells[1][1] == "x"
    o_at = divmod(env.state.history()[1], 3)  # OpenSpiel's action c is the cell (c // 3, c % 3)
    assert cells[o_at[0]][o_at[1]] == "o" and sum(row.count(".") for row in cells) == 7


def test_an_invalid_reply_lists_the_legal_actions_keeps_the_state_and_the_limit_forfeits():
    env = OpenSpielEnv(game="kuhn_poker", seat=0, invalid_limit=2)
    env.reset(task_id=4)
    history = list(env.state.history())
    first = env.step("raise everything")
    assert first.info["invalid"] and not first.done and first.reward == 0.0
    assert first.observation.startswith("'raise everything' is not a legal action. Legal actions: Pass, Bet\n")
    assert env.state.history() == history
    second = env.step("fold")
    assert second.done and second.info["forfeit"] and second.reward == -2.0 == second.info["score"]
    assert env.step("Bet").info["invalid"]  # a step after the end is answered, never raised
    env.reset(task_id=4)
    assert env.step("nope").info["invalid"] and not env.step("Pass").info["invalid"]  # a valid move resets the count


def test_minimax_never_loses_tic_tac_toe_and_mcts_beats_random_play():
    minimax = OpenSpielEnv(game="tic_tac_toe", opponent="bot:minimax")
    rng = random.Random(0)
    outcomes = [play(minimax, t, lambda obs: rng.choice(legal(obs)))[1][-1].reward for t in range(16)]
    assert max(outcomes) <= 0 and outcomes.count(-1.0) >= 10, outcomes
    mcts = OpenSpielEnv(game="tic_tac_toe", opponent="bot:mcts", simulations=200)
    outcomes = [play(mcts, t, lambda obs: rng.choice(legal(obs)))[1][-1].reward for t in range(16)]
    assert outcomes.count(-1.0) >= 10 and outcomes.count(1.0) <= 2, outcomes
    # the same task is the same game against the same MCTS bot
    rerun = [play(OpenSpielEnv(game="tic_tac_toe", opponent="bot:mcts", simulations=200), 3,
                  lambda obs: legal(obs)[0])[0] for _ in range(2)]
    assert rerun[0] == rerun[1]


def test_cfr_plays_its_solved_near_equilibrium_policy_drawing_each_move():
    """``bot:cfr``: CFR+'s average policy, within 0.02 of equilibrium on Leduc; the bot's moves at an information
    state are drawn with that policy's probabilities, seeded by the task; a game it cannot solve is refused."""
    from openmanus_rl_env_openspiel import opponents

    leduc = pyspiel.load_game("leduc_poker")
    assert pyspiel.exploitability(leduc, opponents._solved("leduc_poker").policy) < 0.02
    kuhn = pyspiel.load_game("kuhn_poker")
    state = kuhn.new_initial_state()
    for action in (0, 1):  # the jack to seat 0, the queen to seat 1: seat 0 with the jack bets about a third or less
        state.apply_action(action)
    want = dict(opponents._solved("kuhn_poker").get_state_policy(state))
    bots = [opponents.make("bot:cfr", kuhn, seed, 1) for seed in range(3)]  # (game, seed, simulations)
    draws = [bots[0].act(state) for _ in range(4000)]
    assert 0.0 < want[1] < 0.4 and abs(draws.count(1) / len(draws) - want[1]) < 0.025
    again = opponents.make("bot:cfr", kuhn, 1, 1)
    runs = [[bot.act(state) for _ in range(50)] for bot in (bots[1], again, bots[2])]
    assert runs[0] == runs[1] != runs[2]  # a seed draws the same moves, another seed others
    env = OpenSpielEnv(game="leduc_poker", opponent="bot:cfr", seat=1)
    seen = [play(env, 4, lambda obs: legal(obs)[0])[0] for _ in range(2)]
    assert seen[0] == seen[1] and "bot:cfr" in OpenSpielEnv(game="kuhn_poker").demonstrators
    assert "bot:cfr" not in OpenSpielEnv(game="tic_tac_toe").demonstrators


def test_chance_in_play_and_three_players():
    env = OpenSpielEnv(game="leduc_poker")
    _, results = play(env, 5, lambda obs: "Call")
    assert results[-1].done and "Public:" in env.state.information_state_string(0)  # the public card was dealt
    three = OpenSpielEnv(game="kuhn_poker(players=3)", opponent=["random", "bot:mcts"], simulations=10)
    first = three.reset(task_id=2)
    assert first.startswith("Game: kuhn_poker(players=3). You are player 2 of 3.")
    assert len(three._opponents) == 2 and set(three._opponents) == {0, 1}


@pytest.mark.parametrize("override, line", [
    ("env.kwargs.game=kuhn_pokr", r"^env\.kwargs\.game='kuhn_pokr': OpenSpiel has no game 'kuhn_pokr'; did you mean "
                                  r"kuhn_poker"),
    ("env.kwargs.game=goofspiel", r"^env\.kwargs\.game='goofspiel': a simultaneous-move game; env=openspiel plays "
                                  r"sequential games only"),
    ("env.kwargs.game=tic_tac_toe env.kwargs.opponent=bot:minimx", r"^env\.kwargs\.opponent='bot:minimx': not an "
                                                                   r"opponent here; did you mean bot:minimax\?"),
    ("env.kwargs.game=kuhn_poker env.kwargs.opponent=bot:minimax", r"^env\.kwargs\.opponent=bot:minimax: kuhn_poker: "
                                                                   r"bot:minimax searches two-player zero-sum "
                                                                   r"perfect-information games"),
    ("env.kwargs.game=tic_tac_toe env.kwargs.opponent=bot:cfr", r"^env\.kwargs\.opponent=bot:cfr: tic_tac_toe: "
                                                                r"bot:cfr solves games whose tree is small enough to "
                                                                r"walk every iteration: kuhn_poker, leduc_poker"),
    ('env.kwargs.game="kuhn_poker(players=3)" env.kwargs.opponent=bot:cfr',
     r"^env\.kwargs\.opponent=bot:cfr: kuhn_poker\(players=3\): bot:cfr plays an equilibrium of two-player zero-sum "
     r"games; this one has 3 players"),
    ("env.kwargs.game=connect_four env.kwargs.opponent=bot:minimax", r"^env\.kwargs\.opponent=bot:minimax: "
                                                                     r"connect_four: bot:minimax searches the whole "
                                                                     r"game tree, and this game lasts up to 42 moves"),
    ('env.kwargs.game="kuhn_poker(players=3)" env.kwargs.opponent=[random]',
     r"^env\.kwargs\.opponent=\['random'\]: kuhn_poker\(players=3\) has 3 seats, so the policy's one leaves 2 for "
     r"opponents, and 1 are configured"),
    ("env.kwargs.seat=2", r"^env\.kwargs\.seat=2: must be 0\.\.1 or null"),
    ("env.kwargs.simulations=0", r"^env\.kwargs\.simulations=0: must be a positive integer"),
])
def test_bad_settings_are_one_line_before_anything_starts(override, line):
    with pytest.raises(ConfigError, match=line) as err:
        load(["env=openspiel", *override.split()], training=False)
    assert "\n" not in str(err.value)


def test_a_bad_game_stops_train_with_exit_2_in_one_line_before_a_run_folder(tmp_path, command_here):
    proc = command_here(["train", "env=openspiel", "env.kwargs.game=leduc_pokr", f"trainer.run_dir={tmp_path / 'out'}"])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "OpenSpiel has no game 'leduc_pokr'; did you mean leduc_poker" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_describe_is_a_function_of_the_state_and_seat():
    game = pyspiel.load_game("kuhn_poker")
    state = game.new_initial_state()
    for a in (2, 0, 1):  # deal K to player 0, J to player 1; player 0 bets
        state.apply_action(a)
    text = games.describe(state, 1, "kuhn_poker")
    assert text.splitlines() == ["Game: kuhn_poker. You are player 1 of 2.", "State (as player 1 sees it):", "0b",
                                 "Your card: Jack", "Moves so far: player 0: Bet", "Legal actions: Pass, Bet"]
    assert "Your card: King" in games.describe(state, 0, "kuhn_poker")


def test_leduc_cards_are_named_by_rank_and_the_public_card_and_the_hand_once_dealt():
    state = pyspiel.load_game("leduc_poker").new_initial_state()
    for a in (2, 5):  # a queen (cards 2, 3) to player 0, a king (4, 5) to player 1
        state.apply_action(a)
    assert [l for l in games.describe(state, 0, "leduc_poker").splitlines() if "card" in l] == ["Your card: Queen"]
    for a in (1, 1, 0):  # both call; the public card is a jack
        state.apply_action(a)
    assert [l for l in games.describe(state, 1, "leduc_poker").splitlines() if l.startswith("Your ") or "card" in l] == [
        "Your card: King", "Public card: Jack", "Your hand: King high, no pair"]
    paired = pyspiel.load_game("leduc_poker").new_initial_state()
    for a in (0, 5, 1, 1, 1):  # a jack to player 0, a king to player 1; both call; the public card is the other jack
        paired.apply_action(a)
    assert games.describe(paired, 0, "leduc_poker").splitlines()[3:6] == [
        "Your card: Jack", "Public card: Jack", "Your hand: a pair of Jacks"]


def test_a_board_cell_is_one_token_of_a_tokenizer_trained_on_the_games_text():
    from openmanus_rl_core.models.loading import build_tokenizer

    rng, texts = random.Random(0), []
    for _ in range(100):  # the embedded default trains its tokenizer on the env's own text, as here
        state = pyspiel.load_game("tic_tac_toe").new_initial_state()
        while not state.is_terminal():
            texts.append(games.describe(state, state.current_player(), "tic_tac_toe"))
            state.apply_action(rng.choice(state.legal_actions()))
    tok = build_tokenizer(texts)
    rows = [line for text in texts[:40] for line in text.splitlines() if line[:3] in ("0: ", "1: ", "2: ")]
    assert len(rows) == 120
    for row in rows:
        pieces = [tok.decode([i]) for i in tok.encode(row, add_special_tokens=False)]
        assert pieces[:2] == [row[0], ":"] and pieces[2:] == [f" {c}" for c in row[3::2]]
