"""The fixed opponent of a two-player TextArena game (``env.kwargs.opponent``).

``random``: each turn, a uniformly random move among those the game lists to the opponent in its latest messages
(TextArena's board games end their turn message with such a list: ``Available Moves: '[0]', '[1]', ...`` in
TicTacToe, ``Valid moves: '[2, 3]', ...`` in Othello, ``Available Moves: [a2 b4], ...`` in Crusade). A listed move
the game still refuses (a list holding a template such as ``[bet X]``) is replaced by another listed one, the refused
ones left out. A turn whose messages list no move (a player with no legal move, as in Othello, where any text
then skips the turn) is answered with ``[pass]``. The opponent's random numbers come from its own generator, seeded by the task id, so a task is the
same game against the same opponent in every process.

A game whose messages list no moves cannot be played by it: the config check says so before a run starts.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

__all__ = ["OPPONENTS", "listed_moves", "RandomOpponent"]

# What introduces the moves a player may make ("Available Moves:", "Valid moves:", "Your available actions are:",
# "Legal moves:"); the moves are the bracketed words after it on its line or, when that holds none, on the lines
# below it up to a blank one ("Available actions:" and one move a line).
_INTRO = re.compile(r"\b(valid|available|legal)\s+(moves|actions)\b[^\n]*?:", re.IGNORECASE)
_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")


def listed_moves(texts: list[str]) -> list[str]:
    """The moves of the latest list of moves in ``texts`` (the messages, oldest first), in order, each once; []
    when none lists moves."""
    for text in reversed(texts):
        for intro in reversed(list(_INTRO.finditer(text))):
            rest = text[intro.end():]
            line, _, below = rest.partition("\n")
            moves = _MOVE.findall(line) or _MOVE.findall(below.split("\n\n")[0])
            if moves:
                return list(dict.fromkeys(moves))
    return []


class RandomOpponent:
    """A uniformly random listed move (module docstring). ``pick(texts, refused)`` -> a move, or None when the texts
    list no move that was not refused."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def pick(self, texts: list[str], refused: set[str]) -> str | None:
        listed = listed_moves(texts)
        moves = [m for m in listed or [PASS] if m not in refused]
        return self.rng.choice(moves) if moves else None


PASS = "[pass]"  # the move of a turn whose messages list none

OPPONENTS: dict[str, Callable[[int], Any]] = {"random": RandomOpponent}
