"""A table: one game played by several seat episodes of this process (``opponent=self``).

Each seat is its own episode, with its own env (:class:`~openmanus_rl_env_openspiel.env.OpenSpielEnv`) and its own
trajectory; the envs of one game find the same :class:`Table` by its key (the task's group, the game's index in the
group, the task and the seed) in this process's :data:`TABLES`. A seat's env blocks in ``reset`` until the seat is
to move, and in ``step``, after playing its move, until the seat is to move again or the game ends. The rollout
runs env calls on threads and, with ``rollout.mode=episodes``, generates for whichever episodes are ready, so the
seats take their turns in the order the game gives them; the lockstep loop would wait for every seat's call at
once, which a seat that is not to move never answers (the wait's timeout then ends the episode with an error that
says so).
"""

from __future__ import annotations

import random
import threading
from typing import Any, Callable, Hashable

__all__ = ["Table", "TABLES", "join", "leave"]


class Table:
    """One game in play; every access under ``cond``. ``forfeit``: the seat that forfeited, or None."""

    def __init__(self, game: Any, chance_seed: int):
        self.state = game.new_initial_state()
        self.cond = threading.Condition()
        self.chance = random.Random(chance_seed)
        self.forfeit: int | None = None
        self.seated = 0
        self.left = 0
        self.play_chance()

    @property
    def over(self) -> bool:
        return self.forfeit is not None or self.state.is_terminal()

    def play_chance(self) -> None:
        """Chance moves (the deal, the dice) until a player is to move, from the table's own generator."""
        state = self.state
        while state.is_chance_node():
            outcomes, weights = zip(*state.chance_outcomes())
            state.apply_action(self.chance.choices(outcomes, weights)[0])

    def wait_turn(self, seat: int, timeout_s: float) -> bool:
        """Block until ``seat`` is to move or the game is over; False when ``timeout_s`` passed first."""
        with self.cond:
            return self.cond.wait_for(lambda: self.over or self.state.current_player() == seat, timeout_s)

    def play(self, action: int) -> None:
        """The player to move plays ``action``; chance follows; every waiting seat is woken."""
        with self.cond:
            self.state.apply_action(action)
            self.play_chance()
            self.cond.notify_all()

    def give_up(self, seat: int) -> None:
        with self.cond:
            self.forfeit = seat
            self.cond.notify_all()


TABLES: dict[Hashable, Table] = {}
_LOCK = threading.Lock()


def join(key: Hashable, make: Callable[[], Table]) -> Table:
    """The table of ``key``, made by the first seat that arrives."""
    with _LOCK:
        table = TABLES.get(key)
        if table is None:
            table = TABLES[key] = make()
        table.seated += 1
        return table


def leave(key: Hashable, table: Table, seats: int) -> None:
    """A seat's env closed; the table is forgotten once every seat has left."""
    with _LOCK:
        table.left += 1
        if table.left >= seats and TABLES.get(key) is table:
            del TABLES[key]
