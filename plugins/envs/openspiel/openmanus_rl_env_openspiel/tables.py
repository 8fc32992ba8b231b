"""A table: one OpenSpiel game played by several seat episodes of this process (``opponent=self``).

Each seat is its own episode, with its own env (:class:`~openmanus_rl_env_openspiel.env.OpenSpielEnv`) and its own
trajectory; the envs of one game find the same :class:`Table` by its key (the task's group, the game's index in the
group, the task and the seed) in this process's :data:`TABLES` (the registry and the waiting are the core's:
:mod:`openmanus_rl_core.rollout.tables`). A seat's env blocks in ``reset`` until the seat is to move, and in
``step``, after playing its move, until the seat is to move again or the game ends. The lockstep loop would wait
for every seat's call at once, which a seat that is not to move never answers (the wait's timeout then ends the
episode with an error that says so).
"""

from __future__ import annotations

import random
from typing import Any

from openmanus_rl_core.rollout.tables import Table as SeatedTable
from openmanus_rl_core.rollout.tables import Tables

from openmanus_rl_env_openspiel import games

__all__ = ["Table", "TABLES"]


class Table(SeatedTable):
    """One OpenSpiel game in play, its chance moves drawn from its own generator; ``opening``: the most plies of a
    random opening played before the seats move (:func:`.games.play_opening`, drawn from the task's number)."""

    def __init__(self, game: Any, chance_seed: int, opening: int):
        super().__init__()
        self.state = game.new_initial_state()
        self.chance = random.Random(chance_seed)
        games.play_opening(self.state, opening, chance_seed, self.chance)

    @property
    def to_move(self) -> int:
        return self.state.current_player()

    @property
    def finished(self) -> bool:
        return self.state.is_terminal()

    def play(self, action: int) -> None:
        """The player to move plays ``action``; chance follows; every waiting seat is woken."""
        with self.cond:
            self.state.apply_action(action)
            games.play_chance(self.state, self.chance)
            self.cond.notify_all()


TABLES: Tables[Table] = Tables()
