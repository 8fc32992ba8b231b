"""Who plays the seats the policy does not (``env.kwargs.opponent``): one name for every other seat, or a list with
one name per other seat, in seat order.

- ``random``: a uniformly random legal action;
- ``bot:mcts``: OpenSpiel's MCTS bot (``pyspiel.MCTSBot``, UCT, random-rollout evaluator) with ``simulations``
  simulations a move; it searches the true state, so in an imperfect-information game it sees the hidden cards;
- ``bot:minimax``: alpha-beta search of the whole game tree (``open_spiel.python.algorithms.minimax``), for
  two-player zero-sum perfect-information games without chance that are small enough to search to the end;
- ``bot:cfr``: a near-equilibrium player, CFR+'s average policy (``pyspiel.CFRPlusSolver``), its move drawn from
  the policy's probabilities at the seat's information state; for the two-player games whose tree is small enough
  to solve (:data:`CFR_GAMES`);
- ``self`` (one name for every seat): the policy plays every seat, each seat its own episode (:mod:`.tables`);
  validation tasks and single episodes (the warm-up's) play ``val_opponent`` instead;
- ``pool`` (one name for every seat): snapshots of the policy's earlier behaviour in this run (:mod:`.pool`).

Every opponent draws from its own generator seeded by the task id and its seat, so a task is the same game against
the same opponent in every process.
"""

from __future__ import annotations

import functools
import random
from typing import Any

__all__ = ["OPPONENTS", "SELF", "make", "check", "minimax_problem", "cfr_problem", "seat_opponents"]

MINIMAX_MAX_LENGTH = 12  # longest game (moves) minimax searches to the end: tic_tac_toe's 9 takes well under a second
CFR_GAMES = ("kuhn_poker", "leduc_poker")  # trees CFR+ solves in seconds, once per process
CFR_ITERATIONS = 100  # leduc_poker: exploitability below 0.02 after them (test_openspiel_env.py), in seconds


class Opponent:
    """What an opponent class has: ``problem`` (why it cannot play a game, or None) and ``act``."""

    @staticmethod
    def problem(game: Any, game_string: str, label: str) -> str | None:
        return None


class RandomOpponent(Opponent):
    """A uniformly random legal action."""

    def __init__(self, game: Any, seed: int, simulations: int):
        self.rng = random.Random(seed)

    def act(self, state: Any) -> int:
        return self.rng.choice(state.legal_actions())


class MCTSOpponent(Opponent):
    """OpenSpiel's C++ MCTS bot: UCT (c = 2), ``simulations`` simulations a move, one random rollout per leaf."""

    def __init__(self, game: Any, seed: int, simulations: int):
        import pyspiel

        evaluator = pyspiel.RandomRolloutEvaluator(1, seed)
        self.bot = pyspiel.MCTSBot(game, evaluator, 2.0, int(simulations), 1000, False, seed, False)

    def act(self, state: Any) -> int:
        return self.bot.step(state)


class MinimaxOpponent(Opponent):
    """Alpha-beta search to the end of the game; among equally good moves the first in OpenSpiel's order."""

    @staticmethod
    def problem(game: Any, game_string: str, label: str) -> str | None:
        return minimax_problem(game, label)

    def __init__(self, game: Any, seed: int, simulations: int):
        self.game = game

    def act(self, state: Any) -> int:
        return _best(str(self.game), state.serialize(), state.current_player())


@functools.lru_cache(maxsize=4096)  # a position's best move is searched once per process, whichever env asks
def _best(game_string: str, serialized: str, player: int) -> int:
    import pyspiel
    from open_spiel.python.algorithms import minimax

    game = pyspiel.load_game(game_string)
    state = game.deserialize_state(serialized)
    _, action = minimax.alpha_beta_search(game, state=state, maximum_depth=game.max_game_length() + 1,
                                          maximizing_player_id=player)
    return action


class CFROpponent(Opponent):
    """CFR+'s average policy after :data:`CFR_ITERATIONS` iterations, sampled: a near-equilibrium player."""

    @staticmethod
    def problem(game: Any, game_string: str, label: str) -> str | None:
        return cfr_problem(game, game_string, label)

    def __init__(self, game: Any, seed: int, simulations: int):
        self.policy, self.rng = _solved(str(game)), random.Random(seed)

    def act(self, state: Any) -> int:
        actions, probs = zip(*self.policy.get_state_policy(state))
        return self.rng.choices(actions, weights=probs)[0]


class _Solved:
    """A solved policy and its solver, kept alive with it; ``get_state_policy(state)``: ``[(action, probability)]``."""

    def __init__(self, policy: Any, solver: Any):
        self.policy, self.solver = policy, solver

    def get_state_policy(self, state: Any) -> list[tuple[int, float]]:
        return self.policy.get_state_policy(state)


@functools.lru_cache(maxsize=4)  # solved once per process, whichever env asks
def _solved(game_string: str) -> Any:
    import pyspiel

    solver = pyspiel.CFRPlusSolver(pyspiel.load_game(game_string))
    for _ in range(CFR_ITERATIONS):
        solver.evaluate_and_update_policy()
    return _Solved(solver.average_policy(), solver)  # the C++ policy reads the solver's tables: it must outlive it


OPPONENTS: dict[str, type[Opponent]] = {"random": RandomOpponent, "bot:mcts": MCTSOpponent,
                                            "bot:minimax": MinimaxOpponent, "bot:cfr": CFROpponent}


def minimax_problem(game: Any, label: str) -> str | None:
    import pyspiel

    kind = game.get_type()
    if (game.num_players() != 2 or kind.utility != pyspiel.GameType.Utility.ZERO_SUM
            or kind.information != pyspiel.GameType.Information.PERFECT_INFORMATION):
        return f"{label} searches two-player zero-sum perfect-information games; this one is not (use bot:mcts)"
    if kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
        return f"{label} searches games without chance; this one has chance nodes (use bot:mcts)"
    if game.max_game_length() > MINIMAX_MAX_LENGTH:
        return (f"{label} searches the whole game tree, and this game lasts up to {game.max_game_length()} moves "
                f"(at most {MINIMAX_MAX_LENGTH} are searched; use bot:mcts)")
    return None


def cfr_problem(game: Any, game_string: str, label: str) -> str | None:
    if game_string.split("(", 1)[0].strip() not in CFR_GAMES:
        return f"{label} solves games whose tree is small enough to walk every iteration: {', '.join(CFR_GAMES)}"
    if game.num_players() != 2:
        return f"{label} plays an equilibrium of two-player zero-sum games; this one has {game.num_players()} players"
    return None


def seat_opponents(opponent: Any, players: int) -> list[str]:
    """The opponent of each seat the policy does not play, in seat order (``players - 1`` names)."""
    names = [opponent] * (players - 1) if isinstance(opponent, str) else list(opponent)
    return [str(n) for n in names]


SELF = "self"
"""The policy plays every seat: each seat its own episode of one shared game (:mod:`.tables`)."""


def check(game: Any, game_string: str, opponent: Any, simulations: Any, val_opponent: Any = "random") -> list[str]:
    """``opponent`` for ``game``, checked: ValueError in one line naming the bad value. Returns the names of the
    other seats' opponents (``self`` for each with ``opponent=self``, whose ``val_opponent`` is checked too)."""
    if isinstance(simulations, bool) or not isinstance(simulations, int) or simulations < 1:
        raise ValueError(f"simulations={simulations!r}: must be a positive integer (MCTS simulations a move)")
    if opponent in (SELF, "pool"):  # the pool's own settings: pool.check
        try:
            check(game, game_string, val_opponent, simulations)
        except ValueError as exc:  # the same line, about the key that holds the bad value
            raise ValueError("val_" + str(exc)) from None
        return [opponent] * (game.num_players() - 1)
    if isinstance(opponent, (list, tuple)) and SELF in opponent:
        raise ValueError(f"opponent={list(opponent)}: self plays every seat; give opponent=self, not a list holding it")
    if not isinstance(opponent, (str, list, tuple)):
        raise ValueError(f"opponent={opponent!r}: must be one of {', '.join(OPPONENTS)} or a list of them, one per "
                         f"other seat")
    players = game.num_players()
    names = seat_opponents(opponent, players)
    if len(names) < players - 1:
        raise ValueError(f"opponent={list(names)}: {game_string} has {players} seats, so the policy's one leaves "
                         f"{players - 1} for opponents, and {len(names)} are configured (give one name for all, or "
                         f"{players - 1} names)")
    if len(names) > players - 1:
        raise ValueError(f"opponent={list(names)}: {game_string} has {players} seats, so {players - 1} opponents "
                         f"play, not {len(names)}")
    for name in names:
        if name not in OPPONENTS:
            import difflib

            close = difflib.get_close_matches(name, list(OPPONENTS), n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(f"opponent={name!r}: not an opponent here; {hint}(known: {', '.join(OPPONENTS)}, "
                             f"{SELF})")
        problem = OPPONENTS[name].problem(game, game_string, name)
        if problem:
            raise ValueError(f"opponent={name}: {game_string}: {problem}")
    return names


def make(name: str, game: Any, seed: int, simulations: int) -> Any:
    """The opponent ``name`` for one game, seeded."""
    return OPPONENTS[name](game, seed, simulations)
