"""A table: one two-player TextArena game played by two seat episodes of this process (``opponent=self``).

Each seat is its own episode, with its own env and trajectory; the two envs of one game find the same
:class:`Table` by its key (the task's group, the game's index in the group, the task and the seed) in this
process's :data:`TABLES` (the registry and the waiting are the core's: :mod:`openmanus_rl_core.rollout.tables`).
A seat's env blocks in ``start_task`` until the seat is to move, and in ``step``, after
playing its move, until it is to move again or the game is over; the rollout runs env calls on threads and, with
``rollout.mode=episodes``, generates for whichever episodes are ready, so the seats move in the game's order.
TextArena keeps one message queue per player, so each seat reads only what the game sent it.
"""

from __future__ import annotations

from typing import Any

from openmanus_rl_core.rollout.tables import Table as SeatedTable
from openmanus_rl_core.rollout.tables import Tables
from openmanus_rl_env_textarena import games

__all__ = ["Table", "TABLES"]


class Table(SeatedTable):
    """One game in play; every access under ``cond``, TextArena's code under the table's own random state.
    ``forfeit``: the seat that left the game, or None; ``rewards``: TextArena's at the end (``close()``, once)."""

    def __init__(self, spec: Any, seed: int):
        super().__init__()
        self.rng = games.Isolated()
        with self.rng():
            self.game = games.make(spec)
            self.game.reset(num_players=2, seed=seed)
        self.rewards: dict | None = None

    @property
    def state(self) -> Any:
        return self.game.state

    @property
    def to_move(self) -> int:
        return self.state.current_player_id

    @property
    def finished(self) -> bool:
        return bool(self.state.done)

    def play(self, seat: int, action: str) -> bool:
        """``seat`` (the player to move) plays ``action``; True when the game refused it as invalid. Every waiting
        seat is woken. A game that raises on the move ends the game (the exception is raised to the mover)."""
        with self.cond:
            try:
                errors = getattr(self.state, "error_count", 0)
                with self.rng():
                    self.game.step(action)
                return bool(getattr(self.state, "error_count", 0) > errors)
            except BaseException:
                self.forfeit = seat
                raise
            finally:
                self.cond.notify_all()

    def take(self, seat: int) -> list:
        """The messages sent to ``seat`` since it last read them."""
        with self.cond:
            queues = self.state.observations
            messages, queues[seat] = queues[seat], []
            return messages

    def final_rewards(self) -> dict:
        """TextArena's rewards of the ended game (``close()`` called once, by the first seat that asks)."""
        with self.cond:
            if self.rewards is None:
                with self.rng():
                    rewards, _ = self.game.close()
                self.rewards = dict(rewards or {})
            return self.rewards


TABLES: Tables[Table] = Tables()
