"""OpenSpiel games as text: loading a game string (with close matches for an unknown name), what the player to move
is shown at a state, and reading an action from a reply.

The text a seat sees at a state (:func:`describe`) is a function of that state and seat alone, so the env, the
self-play seats and the exploitability adapter (:mod:`.exploitability`) all show the model the same words for the
same information state.
"""

from __future__ import annotations

import difflib
import random
import re
from typing import Any, Callable

__all__ = ["load", "check_game", "describe", "header", "legal_texts", "match_action", "moves_so_far", "outcome_text",
           "play_chance", "play_opening", "CARDS_IN_WORDS", "BOARDS_APART"]


def _pyspiel():
    import pyspiel

    return pyspiel


def load(game: str) -> Any:
    """``pyspiel.load_game(game)``; an unknown name or bad parameters raise ValueError in one line (close
    matches of an unknown name suggested)."""
    pyspiel = _pyspiel()
    if not isinstance(game, str) or not game.strip():
        raise ValueError(f"game={game!r}: must be an OpenSpiel game string such as kuhn_poker or "
                         f"liars_dice(numdice=2)")
    name = game.split("(", 1)[0].strip()
    known = list(pyspiel.registered_names())
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = (f"did you mean {', '.join(close)}?" if close
                else "python -c 'import pyspiel; print(pyspiel.registered_names())' lists them")
        raise ValueError(f"game={game!r}: OpenSpiel has no game {name!r}; {hint}")
    try:
        return pyspiel.load_game(game)
    except Exception as exc:  # noqa: BLE001  (pyspiel raises its own SpielError on bad parameters)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"game={game!r}: OpenSpiel cannot load it ({first})") from None


def check_game(game: str) -> Any:
    """The loaded game, or ValueError: unknown, bad parameters, or not a sequential game."""
    loaded = load(game)
    kind = loaded.get_type()
    if kind.dynamics != _pyspiel().GameType.Dynamics.SEQUENTIAL:
        raise ValueError(f"game={game!r}: a {str(kind.dynamics).rsplit('.', 1)[-1].lower()}-move game; env=openspiel "
                         f"plays sequential games only (one player moves at a time)")
    if not (kind.provides_information_state_string or kind.provides_observation_string):
        raise ValueError(f"game={game!r}: OpenSpiel gives no text of its states (neither information-state nor "
                         f"observation strings), so a text policy cannot see it")
    return loaded


def _state_text(state: Any, player: int) -> str:
    """What OpenSpiel says ``player`` knows: the observation string of a perfect-information game (a board), else
    the information-state string (the player's private information and the public moves)."""
    kind = state.get_game().get_type()
    perfect = kind.information == _pyspiel().GameType.Information.PERFECT_INFORMATION
    if kind.provides_observation_string and (perfect or not kind.provides_information_state_string):
        return state.observation_string(player)
    return state.information_state_string(player)


def legal_texts(state: Any, player: int | None = None) -> list[str]:
    """The legal actions' texts (``action_to_string``), in OpenSpiel's order."""
    player = state.current_player() if player is None else player
    return [state.action_to_string(player, a) for a in state.legal_actions(player)]


def play_chance(state: Any, rng: random.Random) -> None:
    """Chance moves (the deal, the dice), drawn from ``rng`` by their probabilities, until a player is to move."""
    while state.is_chance_node():
        outcomes, weights = zip(*state.chance_outcomes())
        state.apply_action(rng.choices(outcomes, weights)[0])


def play_opening(state: Any, most: int, number: int, chance: random.Random) -> int:
    """A random opening (exploring starts): a number of plies drawn from ``0..most``, each a uniformly random legal
    move that does not end the game, all drawn from a generator seeded by the game's ``number`` (the task's), so
    every game of that number opens alike; chance moves between them from ``chance``. Returns the plies played
    (fewer where every legal move would end the game)."""
    rng = random.Random(f"opening:{number}")
    plies = rng.randint(0, most)
    played = 0
    while played < plies:
        play_chance(state, chance)
        open_moves = [a for a in state.legal_actions() if not state.child(a).is_terminal()]
        if not open_moves:
            break
        state.apply_action(rng.choice(open_moves))
        played += 1
    play_chance(state, chance)
    return played


def moves_so_far(state: Any) -> list[str]:
    """The players' moves, oldest first, as ``player k: text``; chance outcomes (deals, dice) are left out: some are
    private, and the information state already shows a player its own."""
    history = state.get_game().new_initial_state()
    moves = []
    for action in state.history():
        if not history.is_chance_node():
            who = history.current_player()
            moves.append(f"player {who}: {history.action_to_string(who, action)}")
        history.apply_action(action)
    return moves


_RANKS = ("Jack", "Queen", "King", "Ace")


def _rank(rank: int) -> str:
    return _RANKS[rank] if rank < len(_RANKS) else f"rank {rank}"


def _kuhn_cards(state: Any, player: int) -> list[str]:
    """Kuhn Poker deals card ``c`` (rank ``c``, the lowest 0) to each player in seat order, first thing."""
    dealt = state.history()
    return [f"Your card: {_rank(dealt[player])}"] if len(dealt) > player else []


def _leduc_cards(state: Any, player: int) -> list[str]:
    """Leduc Poker's cards come in two suits: card ``c`` has rank ``c // 2``. Once the public card is dealt, the
    hand it makes with the seat's own card is said too (a pair beats any hand without one): comparing two lines'
    ranks is one more thing a small policy would have to learn before it could play a pair."""
    text = state.information_state_string(player)
    private, public = re.search(r"\[Private: (\d+)\]", text), re.search(r"\[Public: (\d+)\]", text)
    lines = [f"Your card: {_rank(int(private[1]) // 2)}"] if private else []
    if private and public:
        mine, shown = int(private[1]) // 2, int(public[1]) // 2
        lines += [f"Public card: {_rank(shown)}",
                  f"Your hand: a pair of {_rank(mine)}s" if mine == shown else f"Your hand: {_rank(mine)} high, no pair"]
    return lines


CARDS_IN_WORDS: dict[str, Callable[[Any, int], list[str]]] = {"kuhn_poker": _kuhn_cards, "leduc_poker": _leduc_cards}
"""Games whose information-state string gives the cards as bare numbers (Kuhn's ``1pb``: a queen, then pass and
bet), by the game's name: the cards a seat sees, in words, one line each. A number that also names seats and
counts is hard for a small policy to read; a word for each rank is not."""


def _grid(state: Any, player: int) -> str:
    """A board of one character a cell (OpenSpiel's ``x.o`` lines), a row a line with its number, the cells apart:
    ``0: x . o``. Written as OpenSpiel writes it, a byte-level BPE merges neighbouring cells (``xo``, ``..``) into
    one token, so a cell's mark has no token of its own; apart, each cell is one token (`` x``, `` o``, `` .``) at a
    fixed place, and the row's number is the one its actions name (``x(0,2)``)."""
    rows = [row for row in state.observation_string(player).splitlines() if row.strip()]
    columns = " ".join(str(c) for c in range(max(len(r) for r in rows)))
    return "\n".join([f"Board (rows 0-{len(rows) - 1}, columns {columns}):",
                      *(f"{r}: {' '.join(row)}" for r, row in enumerate(rows))])


BOARDS_APART: dict[str, Callable[[Any, int], str]] = {"tic_tac_toe": _grid, "connect_four": _grid}
"""Games whose state text is a board of one character a cell, by the game's name: that board with its cells apart
(:func:`_grid`), in place of OpenSpiel's text."""


def describe(state: Any, player: int, game: str) -> str:
    """The observation ``player`` gets when it is to move at ``state``: the game, its seat, OpenSpiel's text of what
    it knows (and the cards in words, :data:`CARDS_IN_WORDS`), the moves so far and the legal actions.

    A board (:data:`BOARDS_APART`) comes last, after the legal actions: the reply follows it at once, so each cell
    is at the same distance from the reply's tokens on every turn, whatever the length of the moves and the legal
    actions before it. A small policy then finds a cell at a fixed offset; with the board first, the cells moved by
    a token or more with each move played."""
    moves = moves_so_far(state)
    name = state.get_game().get_type().short_name
    cards, board = CARDS_IN_WORDS.get(name), BOARDS_APART.get(name)
    known = [f"State (as player {player} sees it):", (board or _state_text)(state, player),
             *(cards(state, player) if cards else [])]
    play = ["Moves so far: " + ("; ".join(moves) if moves else "none"),
            "Legal actions: " + ", ".join(legal_texts(state, player))]
    return "\n".join([header(game, player, state.get_game().num_players()),
                      *(play + known if board else known + play)])


def header(game: str, player: int, players: int) -> str:
    """The first line of every observation a seat gets: the game and the seat (the plugin's hooks read the role from
    it)."""
    return f"Game: {game}. You are player {player} of {players}."


def outcome_text(state: Any, player: int, game: str) -> str:
    """The end of a game as ``player`` reads it: the header, the moves, and every player's return."""
    moves = moves_so_far(state)
    returns = state.returns()
    return "\n".join([
        header(game, player, len(returns)),
        "The game is over. Moves: " + ("; ".join(moves) if moves else "none"),
        "Returns: " + ", ".join(f"player {p}: {r:g}" for p, r in enumerate(returns)),
        f"Your return: {returns[player]:g}"])


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def match_action(state: Any, reply: str) -> int | None:
    """The legal action of the player to move that ``reply`` names: its text, ignoring case and spacing; None when
    it names none."""
    wanted = _norm(reply)
    player = state.current_player()
    for action in state.legal_actions(player):
        if _norm(state.action_to_string(player, action)) == wanted:
            return action
    return None
