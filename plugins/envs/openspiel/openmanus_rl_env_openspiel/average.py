"""The run's average policy: the policies scored at its validations, mixed as fictitious play mixes its iterates.

Self-play by policy gradient need not settle on an equilibrium in a game of hidden information: its last policy can
circle one, each iterate exploitable in its own way. The mixture of the iterates can be much less exploitable than
any one of them (the average strategy that fictitious play and NFSP report). It is a policy one can play: draw one of
the validated checkpoints uniformly at the start of each game, and let it play the whole game.

As one table (what ``exploitability`` takes), the draw is, at seat ``p``'s information state ``s``,

    avg(a | s) = sum_k x_k(s) pi_k(a | s) / sum_k x_k(s)

where ``x_k(s)`` is the probability that policy ``k`` makes seat ``p``'s own earlier moves on the way to ``s``
(the seat's own reach; the same at every state of ``s`` by perfect recall). An information state none of them
reaches takes their plain mean.

:class:`History` keeps the tables of one training run, by step: the validations after the warm-up (step 0 is the
untrained and the warmed-up policy, not self-play's). A checkpoint of step ``C`` holds those up to ``C``, and a run
resumed from it starts from exactly those (the hooks' ``openmanus_rl_checkpoint_save`` and ``_restore``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from openmanus_rl_env_openspiel.exploitability import table_from_rows, table_rows

__all__ = ["Table", "average_table", "History"]

Table = Mapping[tuple[int, str], Mapping[int, float]]
"""``{(player, information state string): {action: probability}}``, as
:class:`~openmanus_rl_env_openspiel.exploitability.ModelPolicy` scores it."""


def average_table(game: Any, tables: Sequence[Table]) -> dict[tuple[int, str], dict[int, float]]:
    """The mixture of ``tables`` (module docstring) at every information state of ``game``."""
    if not tables:
        raise ValueError("average_table: no policy to average")
    mixed: dict[tuple[int, str], dict[int, float]] = {}

    def walk(state: Any, reach: list[list[float]]) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action), reach)
            return
        player = state.current_player()
        key = (player, state.information_state_string(player))
        own = reach[player]
        legal = state.legal_actions(player)
        if key not in mixed:
            weights = own if sum(own) > 0 else [1.0] * len(tables)
            sums = {a: sum(w * t[key][a] for w, t in zip(weights, tables)) for a in legal}
            total = sum(sums.values())
            mixed[key] = {a: v / total for a, v in sums.items()}
        for action in legal:
            after = list(reach)
            after[player] = [r * t[key][action] for r, t in zip(own, tables)]
            walk(state.child(action), after)

    walk(game.new_initial_state(), [[1.0] * len(tables) for _ in range(game.num_players())])
    return mixed


class History:
    """One training run's validated policies, by step (module docstring)."""

    def __init__(self) -> None:
        self.tables: dict[int, dict] = {}

    def add(self, step: int, table: Table) -> None:
        self.tables[int(step)] = dict(table)

    def average(self, game: Any) -> dict[tuple[int, str], dict[int, float]]:
        return average_table(game, [self.tables[s] for s in sorted(self.tables)])

    def saved(self, step: int) -> dict[int, str]:
        """The tables of the validations up to ``step``, as text: what a checkpoint of ``step`` keeps."""
        return {s: json.dumps(table_rows(t)) for s, t in sorted(self.tables.items()) if s <= step}

    def put_back(self, kept: Mapping[int, str]) -> None:
        """Exactly a checkpoint's tables (:meth:`saved`): a later step's, left by a killed attempt, go."""
        self.tables = {int(s): table_from_rows(json.loads(body)) for s, body in kept.items()}

    def clear(self) -> None:
        self.tables.clear()
