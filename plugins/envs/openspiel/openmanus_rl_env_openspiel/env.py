"""``openspiel``: an OpenSpiel game (PyPI ``open-spiel``) as an env, ``env.kwargs.game=<game string>``
(``kuhn_poker``, ``leduc_poker``, ``tic_tac_toe``, ``connect_four``, ``liars_dice(numdice=2)``, ...).

A task is one game: task id ``t`` (``seed`` when None; neither: a random game) seeds the chance nodes (the deal,
the dice), which the env plays from ``random.Random(t)``, and the opponents (:mod:`.opponents`). The policy plays
seat ``seat`` (None: seat ``t % players``, so the seats alternate over the tasks); the opponents play the others.

Each observation is what the seat knows when it is to move (:func:`.games.describe`): the game and the seat,
OpenSpiel's text of its information state (a perfect-information game's observation string: the board), the moves
so far (chance outcomes left out) and the legal actions' texts. A step's action names one legal action by its text
(``Bet``, ``x(1,1)``, ``Liar``; case and spacing ignored); the env plays it, then chance and the opponents until the
seat is to move again or the game ends.

- An action that names no legal one is invalid (``info["invalid"]``): the state stays, and the observation says so
  and lists the legal actions again. ``invalid_limit`` invalid actions in a row forfeit the game: the seat's
  reward is the game's lowest return (``info["forfeit"]``).
- At the end the step's reward is the seat's return (OpenSpiel's ``returns()``; steps before earn 0);
  ``info["score"]`` is that return, ``info["success"]`` is ``return > 0`` and ``info["returns"]`` every seat's.

Self-play (``opponent=self``): the policy plays every seat. The rollout's sample ``k`` of a task's group
(``sample_index``) is seat ``k % players`` of game ``k // players`` of that group, one episode per seat, each with its
own trajectory and its own return; the seats of one game share it through :mod:`.tables` (so ``rollout.n`` is a
multiple of the seats, and ``rollout.mode=episodes``: a seat's env calls block while the others move). Every game of
a group is dealt from the task, so the same seat across a group's games holds the same cards. Each step's
``info["role"]`` names the game and the seat (``kuhn_poker:seat1``): the ``rae`` estimator's baseline key. Validation
tasks, and episodes started without a group (the warm-up's), play ``val_opponent`` instead.

The pool (``opponent=pool``, :mod:`.pool`): sample ``k`` of a group is the policy in seat ``k % players``, and
the other seats are played by one of the run's snapshots of the policy's earlier behaviour; before the first
snapshot, the group's samples are self-play seats as above.

Exploring starts (``opening_moves=N``): a training game (a row the rollout expanded into a group) first plays a random
opening of ``0..N`` uniformly random legal plies that do not end the game (:func:`.games.play_opening`), drawn from
the task's number, so every game of a group opens alike and the group's mean is that position's value. Self-play
alone reaches the few positions its own lines lead to; the openings show it the others. Validation and single
episodes start from the game's first position.

``oracle_action()`` is a uniformly random legal action (drawn from a generator seeded by the task): it teaches the
warm-up the action format and no strategy.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import random
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from openmanus_rl_core.protocols import StepResult, as_text

from openmanus_rl_env_openspiel import games, opponents, pool, tables

__all__ = ["OpenSpielEnv", "INSTRUCTION", "NO_MOVE"]

INSTRUCTION = ("You are playing {game}, a game for {players} players. Each turn shows what you know, the moves so "
               "far and your legal actions. Your action is the text of exactly one legal action as it is listed "
               "(for example {example}).")


NO_MOVE = "none"
"""The one reply of a seat whose game ended before it moved (:meth:`OpenSpielEnv.action_choices`)."""


def _check_seat(seat: Any, players: int | None = None) -> None:
    if seat is None:
        return
    if isinstance(seat, bool) or not isinstance(seat, int) or seat < 0 or (players is not None and seat >= players):
        allowed = f"0..{players - 1}" if players else "a seat number"
        raise ValueError(f"seat={seat!r}: must be {allowed} or null (null: seat task_id % players)")


def _check_limit(invalid_limit: Any) -> None:
    if isinstance(invalid_limit, bool) or not isinstance(invalid_limit, int) or invalid_limit < 1:
        raise ValueError(f"invalid_limit={invalid_limit!r}: must be a positive integer (invalid actions in a row "
                         f"that forfeit the game)")


def _check_opening(opening_moves: Any) -> None:
    if isinstance(opening_moves, bool) or not isinstance(opening_moves, int) or opening_moves < 0:
        raise ValueError(f"opening_moves={opening_moves!r}: must be a whole number of plies, 0 or more (the most "
                         f"random moves a training game opens with; 0: none)")


def _check_timeout(seat_timeout_s: Any) -> None:
    t = seat_timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise ValueError(f"seat_timeout_s={t!r}: must be a positive number of seconds")


def _seed_of(task: int, seat: int) -> int:
    """A 31-bit seed for seat ``seat``'s opponent in task ``task`` (pyspiel's bots take an int)."""
    return random.Random(f"{task}:{seat}").randrange(2**31)


class OpenSpielEnv:
    """An OpenSpiel game (module docstring).

    kwargs: ``game`` (an OpenSpiel game string), ``opponent`` (a name of
    :data:`~openmanus_rl_env_openspiel.opponents.OPPONENTS` for every other seat, or a list, one per other seat; or
    ``self``), ``seat`` (the policy's seat against fixed opponents, or None for ``task_id % players``),
    ``simulations`` (``bot:mcts``'s simulations a move), ``invalid_limit`` (invalid actions in a row that forfeit),
    ``instruction`` (None: :data:`INSTRUCTION` filled in for the game), ``val_opponent`` (with ``opponent=self``:
    the opponent of the validation tasks and of single episodes), ``seat_timeout_s`` (with ``opponent=self``: how
    long a seat waits for the other seats of its game); with ``opponent=pool`` (:mod:`.pool`): ``pool_dir`` (the
    folder of the snapshots; None in a training run: ``<run_dir>/pool``), ``pool_size`` (the last snapshots drawn from) and ``refresh_steps`` (steps between
    snapshots); ``opening_moves`` (the most random plies a training game opens with, module docstring).
    """

    def __init__(self, game: str = "kuhn_poker", opponent: Union[str, list] = "random", seat: Optional[int] = None,
                 simulations: int = 100, invalid_limit: int = 3, instruction: Optional[str] = None,
                 val_opponent: Union[str, list] = "random", seat_timeout_s: float = 60.0,
                 pool_dir: Optional[str] = None, pool_size: int = 4, refresh_steps: int = 25,
                 opening_moves: int = 0):
        self.game_string = game
        self.game = games.check_game(game)
        self.players = self.game.num_players()
        _check_seat(seat, self.players)
        _check_limit(invalid_limit)
        _check_timeout(seat_timeout_s)
        _check_opening(opening_moves)
        self.opening_moves = int(opening_moves)
        self.opponent_names = opponents.check(self.game, game, opponent, simulations, val_opponent)
        self.league = opponent == pool.POOL
        if self.league:
            pool.check(game, pool_size, refresh_steps)
        self.selfplay = opponent == opponents.SELF or self.league  # a pool without snapshots: self seats
        self.pool_dir = Path(pool_dir) if self.league and pool_dir else None
        self.pool_size, self.refresh_steps = int(pool_size), int(refresh_steps)
        self.pool_step: int | None = None  # the snapshot playing the other seats of this episode
        # the opponents of an episode that is no seat of a self-play game (validation, the warm-up's episodes)
        self.fixed_names = (opponents.seat_opponents(val_opponent, self.players) if self.selfplay
                            else self.opponent_names)
        self.seat, self.simulations, self.invalid_limit = seat, int(simulations), int(invalid_limit)
        self.seat_timeout_s = float(seat_timeout_s)
        example = games.legal_texts(self._first_decision())[0]
        self.instruction = (INSTRUCTION.format(game=game, players=self.players, example=example)
                            if instruction is None else str(instruction))
        self.state: Any = None
        self.own = 0
        self._chance = random.Random(0)
        self._oracle = random.Random(0)
        self._opponents: dict[int, Any] = {}
        self._demonstrating: dict[str, Any] = {}  # the demonstrators' bots of this episode, by name
        self._invalid = 0
        self._over = True  # the episode ended (the game's end, a forfeit)
        self._table: tables.Table | None = None  # a self-play game shared with the other seats' episodes
        self._table_key: Any = None

    def _first_decision(self) -> Any:
        """A state where some player is to move (chance played by its first outcome): for the instruction's example."""
        state = self.game.new_initial_state()
        while state.is_chance_node():
            state.apply_action(state.chance_outcomes()[0][0])
        return state

    @staticmethod
    def serve(run_dir: Optional[str] = None, **kwargs: Any) -> Any:
        """The kwargs every env of the run is built with: with ``opponent=pool``, ``pool_dir`` (null: the training
        run's ``<run_dir>/pool``) made absolute, so the workers (whatever their working folder) find the pool's
        snapshots where the driver writes them."""
        from openmanus_rl_core.plugin.envs import EnvService

        if kwargs.get("opponent") == pool.POOL and not kwargs.get("pool_dir") and run_dir is not None:
            kwargs["pool_dir"] = str(pool.default_dir(run_dir))
        if kwargs.get("pool_dir"):
            kwargs["pool_dir"] = str(Path(kwargs["pool_dir"]).expanduser().resolve())
        return EnvService(kwargs)

    @staticmethod
    def check_run(kwargs: Mapping[str, Any], cfg: Any) -> None:
        """Self-play's needs of the rollout, checked before anything starts (ValueError naming the key): the episodes
        mode (a seat's env call waits while the others move), one sample per seat (``rollout.n`` a multiple of the
        seats), and each actor rank's share of a batch made of whole games."""
        if kwargs.get("opponent") not in (opponents.SELF, pool.POOL):
            return
        if kwargs.get("opponent") == pool.POOL:
            pool.check_run(kwargs, cfg)
        game = str(kwargs.get("game"))
        seats = games.check_game(game).num_players()
        rollout = cfg.rollout
        if rollout.mode != "episodes":
            raise ValueError(f"rollout.mode={rollout.mode}: env.kwargs.opponent=self needs rollout.mode=episodes (a "
                             f"seat's env call waits while the other seats move; lockstep waits for every seat at "
                             f"once)")
        if rollout.n % seats:
            raise ValueError(f"rollout.n={rollout.n}: env.kwargs.opponent=self plays one sample per seat, and {game} "
                             f"has {seats} seats: make rollout.n a multiple of {seats}")
        rows, ranks = cfg.data.train_batch_size * rollout.n, cfg.trainer.num_workers
        if rows % ranks or (rows // ranks) % seats:
            raise ValueError(f"trainer.num_workers={ranks}: the seats of a game play on one actor rank, and "
                             f"{rows} samples a step (data.train_batch_size x rollout.n) do not split into whole games "
                             f"of {seats} seats over {ranks} ranks")

    # ----------------------------------------------------------------------------------- protocol
    def start_task(self, task: Mapping[str, Any]) -> str:
        """A rollout's task row. With ``opponent=self``, a training row the rollout expanded (it has ``group_id`` and
        ``sample_index``) is seat ``sample_index % players`` of game ``sample_index // players`` of its group;
        anything else is :meth:`reset`."""
        index = task.get("sample_index")
        chosen = _task_number(task.get("task_id"), task.get("seed"))
        training = task.get("split") != "val" and task.get("group_id") is not None and index is not None
        opening = self.opening_moves if training else 0
        if not self.selfplay or not training:
            return self._start_fixed(chosen, opening)
        if self.league and self._start_pool(task, chosen, int(index) % self.players, opening):
            return self._observation()
        self._begin(chosen, int(index) % self.players)
        self._table_key = (self.game_string, task["group_id"], int(index) // self.players, task.get("task_id"),
                           task.get("seed"))
        self._table = tables.TABLES.join(self._table_key, lambda: tables.Table(self.game, chosen, opening))
        self.state = self._table.state
        self._wait_turn("its first move")
        self._over = False
        return self._observation()

    def _start_pool(self, task: Mapping[str, Any], chosen: int, seat: int, opening: int) -> bool:
        """A pool episode: the policy in ``seat``, a snapshot in the others (False: no snapshot yet, play self)."""
        if self.pool_dir is None:  # no folder (an env built outside a training run): self seats
            return False
        step = pool.training_step(task.get("group_id"))
        if step is None:  # the group stream's ids carry no step: the newest snapshot of the folder
            step = (pool.snapshots(self.pool_dir) or [-1])[-1] + 1
        snapshot = pool.choose(self.pool_dir, step, chosen, seat, self.pool_size, self.refresh_steps)
        if snapshot is None:
            pool.say_once(step)
            self.pool_step = None
            return False
        table = pool.load(self.pool_dir, snapshot)
        self._begin(chosen, seat)
        self.pool_step = snapshot
        self._opponents = {p: pool.PoolOpponent(table, _seed_of(chosen, p), snapshot)
                           for p in range(self.players) if p != seat}
        self._new_game(chosen, opening)
        self._over = False
        return True

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """The game of task ``task_id`` (``seed`` when None; a random one when both are) against the fixed opponents."""
        return self._start_fixed(_task_number(task_id, seed), 0)

    def _start_fixed(self, chosen: int, opening: int) -> str:
        """The game of number ``chosen`` against the fixed opponents, after a random opening of at most ``opening``
        plies."""
        self._begin(chosen, chosen % self.players if self.seat is None else self.seat)
        others = [p for p in range(self.players) if p != self.own]
        self.pool_step = None
        self._opponents = {p: opponents.make(name, self.game, _seed_of(chosen, p), self.simulations)
                           for p, name in zip(others, self.fixed_names)}
        self._new_game(chosen, opening)
        self._over = False
        return self._observation()

    def step(self, action: str) -> StepResult:
        """Play one action (module docstring)."""
        if self.state is None:
            raise RuntimeError("openspiel env: call reset() before step()")
        info = self._info()
        if self._over:  # a step after the end: answered, never raised (the protocol's step is total)
            return StepResult("The episode is over.", 0.0, True, {**info, "invalid": True})
        if self._game_over():  # the game ended before this seat's first move: its result, whatever the reply
            return self._result(info)
        text = as_text(action)
        chosen = games.match_action(self.state, text)
        if chosen is None:
            return self._invalid_reply(text, info)
        self._invalid = 0
        if self._table is not None:
            self._table.play(chosen)
            self._wait_turn("its next move")
        else:
            self.state.apply_action(chosen)
            self._play_others()
        if self._game_over():
            return self._result(info)
        return StepResult(games.describe(self.state, self.own, self.game_string), 0.0, False, info)

    def close(self) -> None:
        if self._table is not None:
            if not self._over and not self._table.over:  # a seat that leaves mid-game frees the others' waits
                self._table.give_up(self.own)
            tables.TABLES.leave(self._table_key, self._table, self.players)
            self._table = None
        self.state = None

    # ----------------------------------------------------------------------------------- extras
    def _begin(self, chosen: int, seat: int) -> None:
        if self._table is not None:  # a new episode on an env that still sits at a table
            tables.TABLES.leave(self._table_key, self._table, self.players)
            self._table = None
        self.own = seat
        self._chance = random.Random(chosen)
        self._oracle = random.Random(f"oracle:{chosen}")
        self._opponents = {}
        self._demonstrating = {}
        self._invalid = 0

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"game": self.game_string, "seat": self.own,
                                "role": f"{self.game_string}:seat{self.own}", "invalid": False}
        if self._table is not None:
            info["selfplay"] = True
        if self.pool_step is not None:
            info["pool_step"] = self.pool_step
        return info

    def _observation(self) -> str:
        if self._game_over():
            if self.state.is_terminal():
                return games.outcome_text(self.state, self.own, self.game_string)
            return self._forfeit_text()
        return games.describe(self.state, self.own, self.game_string)

    def _game_over(self) -> bool:
        return self._table.over if self._table is not None else self.state.is_terminal()

    def _forfeit_text(self) -> str:
        return (games.header(self.game_string, self.own, self.players)
                + f"\nThe game is over: player {self._table.forfeit} forfeited it. Your return: 0")

    def _result(self, info: dict[str, Any]) -> StepResult:
        """The end of the game for this seat."""
        self._over = True
        if self._table is not None and self._table.forfeit is not None:  # another seat gave the game up
            return StepResult(self._forfeit_text(), 0.0, True,
                              {**info, "forfeit_by": self._table.forfeit, "score": 0.0, "success": False})
        returns = [float(r) for r in self.state.returns()]
        reward = returns[self.own]
        info.update(score=reward, success=reward > 0, returns=returns)
        return StepResult(games.outcome_text(self.state, self.own, self.game_string), reward, True, info)

    def _invalid_reply(self, text: str, info: dict[str, Any]) -> StepResult:
        self._invalid += 1
        info["invalid"] = True
        shown = repr(text.strip()[:80])
        if self._invalid >= self.invalid_limit:
            worst = float(self.game.min_utility())
            self._over = True
            if self._table is not None:
                self._table.give_up(self.own)
            return StepResult(f"{shown} is not a legal action; {self.invalid_limit} invalid actions in a row forfeit "
                              f"the game. Your return: {worst:g}", worst, True,
                              {**info, "forfeit": True, "score": worst, "success": False})
        legal = ", ".join(games.legal_texts(self.state))
        return StepResult(f"{shown} is not a legal action. Legal actions: {legal}\n"
                          + games.describe(self.state, self.own, self.game_string), 0.0, False, info)

    def _wait_turn(self, what: str) -> None:
        """Self-play: block until this seat is to move or the game is over (module :mod:`.tables`)."""
        if not self._table.wait_turn(self.own, self.seat_timeout_s):
            raise RuntimeError(
                f"openspiel env: seat {self.own} of a {self.game_string} game waited {self.seat_timeout_s:g}s for the "
                f"other seats before {what}; opponent=self needs rollout.mode=episodes, rollout.n a multiple of "
                f"{self.players} (one episode per seat), and every seat of a game on one actor rank")

    def _new_game(self, chosen: int, opening: int) -> None:
        """A new game: its random opening (the same for every game of number ``chosen``), then chance and the
        opponents until the policy's seat is to move."""
        self.state = self.game.new_initial_state()
        games.play_opening(self.state, opening, chosen, self._chance)
        self._play_others()

    def _play_others(self) -> None:
        """Chance and the opponents move until the policy's seat is to move or the game ends."""
        state = self.state
        games.play_chance(state, self._chance)
        while not state.is_terminal() and state.current_player() != self.own:
            state.apply_action(self._opponents[state.current_player()].act(state))
            games.play_chance(state, self._chance)

    def action_choices(self) -> list[str] | None:
        """The legal actions' texts while this seat is to move, None once its episode is over: with
        ``rollout.constrain_actions=true`` each reply is decoded as one of them. A game that ended before this seat's
        first move (an opening that left the seat before it a winning move) still asks the seat for one reply, which
        decides nothing: its one choice is :data:`NO_MOVE`, so every token of it is forced and the update leaves it
        out."""
        if self.state is None or self._over:
            return None
        if self._game_over():
            return [NO_MOVE]
        return games.legal_texts(self.state, self.own)

    def oracle_action(self) -> str:
        """A uniformly random legal action's text (the warm-up learns the format from it, not a strategy)."""
        if self.state is None or self._over or self._game_over():
            raise RuntimeError("openspiel env: oracle_action() needs a game in play (reset() first)")
        return self._oracle.choice(games.legal_texts(self.state))

    @property
    def demonstrators(self) -> dict[str, str]:
        """OpenSpiel's bots as demonstrators of the seat (``warmup.demonstrator=bot:mcts``): an imitation baseline,
        what the model learns from a strong player's moves on the warm-up's budget. ``bot:minimax`` only where it
        can search the game (:func:`.opponents.minimax_problem`), ``bot:cfr`` where CFR+ solves it
        (:func:`.opponents.cfr_problem`); MCTS searches the true state, hidden cards too."""
        offered = {"bot:mcts": f"OpenSpiel's MCTS bot, {self.simulations} simulations a move",
                   "bot:minimax": "alpha-beta search to the end: a best move, the first in OpenSpiel's order",
                   "bot:cfr": f"CFR+'s average policy after {opponents.CFR_ITERATIONS} iterations, sampled"}
        return {name: says for name, says in offered.items()
                if opponents.OPPONENTS[name].problem(self.game, self.game_string, name) is None}

    def demonstrator_action(self, name: str) -> str:
        """The move of the bot ``name`` (one of :attr:`demonstrators`) for this seat, as the action's text; each
        episode's bot is seeded by its task."""
        if name not in self.demonstrators:
            raise ValueError(f"demonstrator {name!r}: openspiel ({self.game_string}) offers "
                             f"{', '.join(self.demonstrators)}")
        if self.state is None or self._over or self._game_over():
            raise RuntimeError("openspiel env: demonstrator_action() needs a game in play (reset() first)")
        if name not in self._demonstrating:
            self._demonstrating[name] = opponents.make(name, self.game, self._oracle.randrange(2**31),
                                                       self.simulations)
        return self.state.action_to_string(self.own, self._demonstrating[name].act(self.state))


def _task_number(task_id: Any, seed: Any) -> int:
    """The number a game is dealt from: ``task_id``, else ``seed``, else a random one."""
    for name, value in (("task_id", task_id), ("seed", seed)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError(f"openspiel env: {name} must be an int, got {type(value).__name__} {value!r}")
    chosen = task_id if task_id is not None else seed
    return int(chosen) if chosen is not None else random.SystemRandom().randrange(2**31)


def _kwargs_dataclass() -> type:
    """``env.kwargs``, checked before the run starts: the fields and defaults are the constructor's; building it
    checks the game (unknown, with close matches; not sequential), the seat and the opponents, in one line each."""
    params = [p for p in inspect.signature(OpenSpielEnv.__init__).parameters.values() if p.name != "self"]
    hints = typing.get_type_hints(OpenSpielEnv.__init__)
    fields = [(p.name, hints[p.name], dataclasses.field(default=p.default)) for p in params]

    def __post_init__(self) -> None:
        game = games.check_game(self.game)
        if self.opponent == pool.POOL:
            pool.check(self.game, self.pool_size, self.refresh_steps)
        _check_seat(self.seat, game.num_players())
        _check_limit(self.invalid_limit)
        _check_timeout(self.seat_timeout_s)
        _check_opening(self.opening_moves)
        opponent = list(self.opponent) if not isinstance(self.opponent, str) else self.opponent
        val_opponent = list(self.val_opponent) if not isinstance(self.val_opponent, str) else self.val_opponent
        opponents.check(game, self.game, opponent, self.simulations, val_opponent)

    return dataclasses.make_dataclass("Kwargs", fields, namespace={"__post_init__": __post_init__})


OpenSpielEnv.Kwargs = _kwargs_dataclass()
