"""Tables: one game of several seats, played by several episodes of this process (self-play, ``opponent=self``).

Each seat is its own episode, with its own env and its own trajectory. The envs of one game find the same table by
its key (an env plugin uses the task's group, the game's index in the group, the task and the seed) in a
:class:`Tables` registry of its own. A seat's env blocks until its seat is to move (:meth:`Table.wait_turn`); the
rollout runs env calls on threads and, with ``rollout.mode=episodes``, generates for whichever episodes are ready,
so the seats move in the order the game gives them. An env plugin's table subclasses :class:`Table` with its game,
saying who is to move and whether the game has finished.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, Hashable, TypeVar

__all__ = ["Table", "Tables"]


class Table:
    """One game in play, shared by its seats' envs; every access under ``cond``. ``forfeit``: the seat that left
    the game before its end, or None. Subclasses give :attr:`to_move` and :attr:`finished`."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.forfeit: int | None = None
        self.left = 0  # seats whose env is done with the table

    @property
    def to_move(self) -> int:
        """The seat to move now."""
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        """The game reached its end by its own rules."""
        raise NotImplementedError

    @property
    def over(self) -> bool:
        return self.forfeit is not None or self.finished

    def wait_turn(self, seat: int, timeout_s: float) -> bool:
        """Block until ``seat`` is to move or the game is over; False when ``timeout_s`` passed first."""
        with self.cond:
            return self.cond.wait_for(lambda: self.over or self.to_move == seat, timeout_s)

    def give_up(self, seat: int) -> None:
        """``seat`` leaves a game that is not over: the game ends, forfeited by it; every waiting seat is woken."""
        with self.cond:
            if not self.over:
                self.forfeit = seat
            self.cond.notify_all()


T = TypeVar("T", bound=Table)


class Tables(Generic[T]):
    """The tables in play in this process, by key: the first seat to arrive makes one, the last to leave forgets
    it."""

    def __init__(self) -> None:
        self.open: dict[Hashable, T] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.open)

    def __len__(self) -> int:
        return len(self.open)

    def clear(self) -> None:
        with self._lock:
            self.open.clear()

    def join(self, key: Hashable, make: Callable[[], T]) -> T:
        """The table of ``key``, made by the first seat that arrives."""
        with self._lock:
            table = self.open.get(key)
            if table is None:
                table = self.open[key] = make()
            return table

    def leave(self, key: Hashable, table: T, seats: int) -> None:
        """A seat's env is done with ``table``; it is forgotten once all ``seats`` have left."""
        with self._lock:
            table.left += 1
            if table.left >= seats and self.open.get(key) is table:
                del self.open[key]
