"""Expert moves for the TextArena games that have a cheap solver, by the game's class (so every variant of an id
has it): each takes the bare TextArena game (its ``state``) and returns the next move as the game reads it.

- ``GuessTheNumberEnv``: binary search over what the hints left open (1..20 in at most 5 guesses, 1..50 in 6).
- ``TowerOfHanoiEnv``: the optimal next move from the current towers to tower C (7 moves for 3 disks).
- ``FrozenLakeEnv``: the first step of a shortest path around the holes to the goal.
- ``TicTacToeEnv`` (two-player, the model's seat): minimax, the quickest win first; it never loses, and wins when
  the opponent errs (against ``opponent=random``, most games).

Other games have no oracle: the env then has no ``oracle_action`` and the warm-up is skipped.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Any, Callable

__all__ = ["ORACLES"]


def guess_the_number(game: Any) -> str:
    low, high = game.min_number, game.max_number
    for guess, hint in game.state.game_state["guess_history"]:
        if hint == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return f"[{(low + high) // 2}]"


def _hanoi(where: dict[int, str], disk: int, target: str) -> tuple[str, str] | None:
    """The first move that brings disks ``1..disk`` onto ``target`` (None when they are there)."""
    while disk >= 1 and where[disk] == target:
        disk -= 1
    if disk == 0:
        return None
    source = where[disk]
    spare = ({"A", "B", "C"} - {source, target}).pop()
    return _hanoi(where, disk - 1, spare) or (source, target)


def tower_of_hanoi(game: Any) -> str:
    towers = game.state.game_state["towers"]
    where = {disk: name for name, disks in towers.items() for disk in disks}
    move = _hanoi(where, game.num_disks, "C")
    return f"[{move[0]} {move[1]}]" if move else "[A C]"


def frozen_lake(game: Any) -> str:
    grid, size = game.state.game_state["grid"], game.size
    start = tuple(game.state.game_state["player_pos"])
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == "G":
            return f"[{first[(r, c)]}]"
        for name, (dr, dc) in steps.items():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in first and grid[nxt[0]][nxt[1]] != "H":
                first[nxt] = first[(r, c)] or name
                queue.append(nxt)
    return "[up]"  # no path (TextArena's generator keeps one open)


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


@lru_cache(maxsize=None)
def _tic_tac_toe_value(cells: tuple[str, ...], turn: str) -> int:
    """The value of the board for ``turn``, to move: +(k+1) for a win with k cells still free, -(k+1) for a loss, 0
    for a draw, under best play on both sides."""
    other = "X" if turn == "O" else "O"
    if any(cells[a] == cells[b] == cells[c] == other for a, b, c in _LINES):
        return -(cells.count("") + 1)
    free = [i for i, c in enumerate(cells) if not c]
    if not free:
        return 0
    return max(-_tic_tac_toe_value(cells[:i] + (turn,) + cells[i + 1:], other) for i in free)


def tic_tac_toe(game: Any) -> str:
    cells = tuple(c for row in game.state.game_state["board"] for c in row)
    me = "X" if game.state.current_player_id == 1 else "O"  # TextArena's marks: player 0 'O', player 1 'X'
    other = "X" if me == "O" else "O"
    free = [i for i, c in enumerate(cells) if not c]
    return f"[{max(free, key=lambda i: -_tic_tac_toe_value(cells[:i] + (me,) + cells[i + 1:], other))}]"


ORACLES: dict[str, Callable[[Any], str]] = {
    "GuessTheNumberEnv": guess_the_number,
    "TowerOfHanoiEnv": tower_of_hanoi,
    "FrozenLakeEnv": frozen_lake,
    "TicTacToeEnv": tic_tac_toe,
}
