"""env=textarena's two-player games against a fixed opponent (``env.kwargs.opponent=random``), on the real
TextArena: the seat alternates with the task id, a perfect player never loses and a random one does (the reward is
the model's seat's), the same task and moves give the same game, the opponent plays only listed moves, and the list
reader reads the formats TextArena's games write."""

from __future__ import annotations

import functools
import random
import re

import pytest

from openmanus_rl_core.testing import check_env
from openmanus_rl_env_textarena import TWO_PLAYER_INSTRUCTION, TextArenaEnv
from openmanus_rl_env_textarena.opponents import RandomOpponent, listed_moves

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def board(observation: str) -> list[str]:
    """The nine cells of the last TicTacToe board in an observation: 'O', 'X' or '' (free)."""
    block = observation.rsplit("Current Board:", 1)[1].strip("\n").splitlines()
    rows = [block[i] for i in (0, 2, 4)]
    return [c.strip() if c.strip() in ("O", "X") else "" for row in rows for c in row.split("|")]


def winner(cells: list[str]) -> str | None:
    return next((cells[a] for a, b, c in LINES if cells[a] and cells[a] == cells[b] == cells[c]), None)


@functools.lru_cache(maxsize=None)
def score(cells: tuple[str, ...], turn: str, me: str) -> int:
    """+1: ``me`` wins, -1: the other mark wins, 0: a draw, ``turn`` to move, best play on both sides."""
    w = winner(list(cells))
    if w:
        return 1 if w == me else -1
    free = [i for i, c in enumerate(cells) if not c]
    if not free:
        return 0
    nxt = "X" if turn == "O" else "O"
    results = [score(cells[:i] + (turn,) + cells[i + 1:], nxt, me) for i in free]
    return max(results) if turn == me else min(results)


def perfect_move(cells: list[str], me: str) -> int:
    """Minimax: a move of ``me`` that never loses."""
    other = "X" if me == "O" else "O"
    free = [i for i, c in enumerate(cells) if not c]
    return max(free, key=lambda i: score(tuple(cells[:i] + [me] + cells[i + 1:]), other, me))


def play(task: int, choose) -> tuple[list[str], float, dict]:
    env = TextArenaEnv(game="TicTacToe-v0", opponent="random")
    seen = [env.reset(task_id=task)]
    me = re.search(r"you will be '([OX])'", seen[0]).group(1)
    while True:
        result = env.step(choose(seen[-1], me))
        seen.append(result.observation)
        if result.done:
            return seen, result.reward, result.info


def test_the_seat_alternates_with_the_task_and_the_opponent_opens_on_odd_tasks():
    first = {t: TextArenaEnv(game="TicTacToe-v0", opponent="random").reset(task_id=t) for t in range(4)}
    for t, text in first.items():
        opened = re.findall(r"^\[Player (\d)\] \[(\d)\]$", text, re.MULTILINE)
        assert ("You are Player 1" in text) == (t % 2 == 1)
        assert opened == ([] if t % 2 == 0 else [("0", opened[0][1])])
        assert sum(c != "" for c in board(text)) == t % 2  # the opening move is on the board shown
    fixed = TextArenaEnv(game="TicTacToe-v0", opponent="random", seat=0).reset(task_id=1)
    assert "You are Player 0" in fixed and "[Player" not in fixed
    assert TextArenaEnv(game="TicTacToe-v0", opponent="random").instruction == TWO_PLAYER_INSTRUCTION


def test_the_reward_is_the_models_seats_a_perfect_player_never_loses_a_random_one_does():
    perfect = [play(t, lambda obs, me: f"[{perfect_move(board(obs), me)}]") for t in range(20)]
    rewards = [r for _, r, _ in perfect]
    assert set(rewards) <= {0.0, 1.0} and rewards.count(1.0) >= 14, rewards
    assert all(info["success"] == (r == 1.0) and info["score"] == r for _, r, info in perfect)
    rng = random.Random(0)
    randoms = [play(t, lambda obs, me: rng.choice(listed_moves([obs]))) for t in range(20)]
    assert -1.0 in {r for _, r, _ in randoms}  # a random player loses some: the sign is the seat's
    for seen, reward, info in perfect + randoms:  # the reward agrees with the last board the model was shown
        mark = re.search(r"you will be '([OX])'", seen[0]).group(1)
        w = winner(board(seen[-1]))
        assert reward == (0.0 if w is None else 1.0 if w == mark else -1.0), (reward, seen[-1])


def test_the_tic_tac_toe_oracle_never_loses_and_wins_most_games_against_the_random_opponent():
    results = []
    for task in range(30):
        env = TextArenaEnv(game="TicTacToe-v0", opponent="random")
        env.reset(task_id=task)
        for _ in range(5):
            result = env.step(env.oracle_action())
            if result.done:
                break
        assert result.done and not result.info["invalid"]
        results.append(result.reward)
    assert -1.0 not in results and results.count(1.0) >= 24, results
    assert not hasattr(TextArenaEnv(game="Othello-v0", opponent="random"), "oracle_action")


def test_the_same_task_and_moves_give_the_same_game_and_the_opponent_plays_listed_moves():
    def moves(obs, me):
        return f"[{next(i for i, c in enumerate(board(obs)) if not c)}]"  # the first free cell

    for task in range(6):
        a, b = play(task, moves), play(task, moves)
        assert a[0] == b[0] and a[1] == b[1]
        shown = "\n".join(a[0])
        for listed, move in re.findall(r"Available Moves: ([^\n]*)\n\[Player \d\] (\[\d\])", shown):
            assert move in listed  # every opponent move was one the board listed before it
    openings = {TextArenaEnv(game="TicTacToe-v0", opponent="random").reset(task_id=t).split("[Player 0] ")[1][:3]
                for t in range(1, 40, 2)}
    assert len(openings) >= 4  # a random opponent, seeded per task: not one fixed opening


def test_a_two_player_game_takes_any_text_and_other_games_play_against_the_opponent():
    check_env(lambda: TextArenaEnv(game="TicTacToe-v0", opponent="random"), task_ids=[0, 1, None],
              actions=["[4]", "[0]", "4"])
    for game in ("Othello-v0", "SimpleTak-v0", "WildTicTacToe-v0"):
        ends = []
        for task in range(4):
            env = TextArenaEnv(game=game, opponent="random")
            obs, rng = env.reset(task_id=task), random.Random(task)
            for _ in range(100):
                result = env.step(rng.choice(listed_moves([obs]) or ["[pass]"]))
                obs = result.observation
                if result.done:
                    break
            assert result.done and "game_error" not in result.info and not result.info["invalid"], (game, obs)
            ends.append(result.reward)
        assert set(ends) <= {-1.0, 0.0, 1.0}


@pytest.mark.parametrize("texts, moves", [
    (["Current Board:\n 0 | 1 | 2\nAvailable Moves: '[0]', '[1]', '[2]'"], ["[0]", "[1]", "[2]"]),
    (["Game Board:\nValid moves: '[2, 3]', '[3, 2]'\nScores - Black: 2, White: 2"], ["[2, 3]", "[3, 2]"]),
    (["Available Moves: [a2 b4], [a2 c3], [a2 b4]"], ["[a2 b4]", "[a2 c3]"]),
    (["[GAME] Your available actions are: '[check]', '[bet]'"], ["[check]", "[bet]"]),
    (["Available actions:\n[accept]\n[deny]\n\nRound 2 [ignored]"], ["[accept]", "[deny]"]),
    (["Valid moves: '[1]'", "Player 1 placed [4]. Valid moves: '[5]', '[6]'"], ["[5]", "[6]"]),
    (["Valid moves: '[1]'", "Please resubmit a valid move and follow the rules [4]"], ["[1]"]),
    (["On your turn write [4] to play the centre."], []),
])
def test_the_list_of_moves_is_read_in_each_games_format(texts, moves):
    assert listed_moves(texts) == moves
    assert RandomOpponent(0).pick(texts, set()) in (moves or ["[pass]"])
    assert RandomOpponent(0).pick(texts, set(moves or ["[pass]"])) is None
