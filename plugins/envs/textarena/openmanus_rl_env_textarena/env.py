"""``textarena``: TextArena's text games (PyPI ``textarena``) as an env, ``env.kwargs.game=<id>``: single-player
games, and two-player games against a fixed opponent (``env.kwargs.opponent``, :mod:`.opponents`).

A task is one game as TextArena deals it: task id ``t`` is ``reset(num_players=1, seed=t)`` of ``ta.make(game,
**config)`` (``task_id=None`` uses ``seed``; neither: a random game). Each game keeps its own ``random`` state
(:class:`~openmanus_rl_env_textarena.games.Isolated`), so the same task id gives the same game, and the same moves
the same result, in any process and however many envs play at once (games that draw during play included).

An episode: :meth:`TextArenaEnv.reset` returns what TextArena sends the player first (the game's rules, and its
board for board games); each :meth:`TextArenaEnv.step` sends the action (the template's action: the text inside
``<action>...</action>`` with ``react``; a reply the template cannot parse arrives whole) to ``step`` of the game
with its action wrappers (``[...]`` added to a bare move), and returns what TextArena sent the player since, one
``[GAME] message`` line each, as TextArena's ``LLMObservationWrapper`` writes them (the echo of the player's own
move left out). When the game ends, TextArena's reason closes the observation and:

- the step's reward is TextArena's reward (``close()``'s ``rewards[0]``: 1 for a win, the game's share of
  completion otherwise, the game's own penalty after an invalid move); steps before it earn 0;
- ``info["score"]``: that reward; ``info["success"]``: ``reward >= success_threshold``; ``info["reason"]``:
  TextArena's reason.

An illegal move is what TextArena calls an invalid move: ``info["invalid"]`` is True and the observation is
TextArena's own message ("You attempted an invalid move. Reason: ... Please resubmit a valid move ..."). TextArena
lets a player resubmit once; a second invalid move in a row ends the game with the game's reward. A game that
raises on a move ends the episode as invalid (reward 0, the error in ``info["game_error"]``): never a crash.

Two-player games (``opponent`` set): task id ``t`` is ``reset(num_players=2, seed=t)``; the model plays seat
``seat`` (None: seat ``t % 2``, so half the tasks open with the opponent's move) and the opponent (seeded by ``t``)
plays the other. Each step plays the model's move, then the opponent's moves until the model is to play or the game
ends; the observation holds the opponent's moves as ``[Player k] move`` lines among the game's. The reward is
TextArena's for the model's seat: 1 for a win, -1 for a loss, 0 for a draw. An invalid move of the opponent's is
replaced by another listed move; an opponent left with no move the game takes ends the episode (reward 0, ``info
["game_error"]``).

Self-play (``opponent=self``): the policy plays both seats. The rollout's sample ``k`` of a task's group
(``sample_index``) is seat ``k % 2`` of game ``k // 2`` of that group, one episode per seat, each with its own
trajectory and its own reward (TextArena's for that seat); the two seats of a game share it through :mod:`.tables`,
so ``rollout.n`` is even and ``rollout.mode=episodes`` (a seat's env calls block while the other moves). Every game
of a group is ``reset(num_players=2, seed=t)``. Validation tasks, and episodes started without a group (the
warm-up's), play ``val_opponent`` instead. A seat that leaves a game early (its env closed mid-game) ends it for the
other with reward 0 and ``info["forfeit_by"]``. Each self-play step's ``info["role"]`` names the game and the seat
(``TicTacToe-v0:seat1``): the ``rae`` estimator's baseline key, and (:mod:`.hooks`) GRPO's groups per seat.

``oracle_action()`` exists for games with a cheap solver (:mod:`openmanus_rl_env_textarena.oracles`:
GuessTheNumber, TowerOfHanoi, FrozenLake, TicTacToe); other games have no oracle: ``hasattr(env, "oracle_action")`` is False
and the warm-up is skipped.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import random
import typing
from typing import Any, Dict, Optional

from openmanus_rl_core.protocols import StepResult, as_text

from openmanus_rl_env_textarena import games, tables
from openmanus_rl_env_textarena.opponents import OPPONENTS
from openmanus_rl_env_textarena.oracles import ORACLES

__all__ = ["TextArenaEnv", "DEFAULT_INSTRUCTION", "TWO_PLAYER_INSTRUCTION", "render"]

MAX_OPPONENT_MOVES = 200  # moves of the opponent's in a row before the env gives the game up
DEFAULT_INSTRUCTION = ("You are playing a single-player text game. Read the game's rules and its messages. Your "
                       "action is one move, written the way the game asks for it (for example [5] or [A C]).")
TWO_PLAYER_INSTRUCTION = ("You are playing a two-player text game against an opponent. Read the game's rules and its "
                          "messages; the opponent's moves appear as [Player N] lines. Your action is one move, written "
                          "the way the game asks for it (for example [4]).")


def render(messages: list[tuple[int, str, Any]], own: int = 0, players: int = 1) -> str:
    """The messages to player ``own`` of ``players`` as ``[GAME] text`` and ``[Player k] move`` lines
    (``LLMObservationWrapper``'s layout). The player's own moves are left out (its reply already holds them): its
    messages, and the game's echo of a move (typed ``PLAYER_ACTION``). A sender that is no player's seat (some games
    of textarena 0.7.4 pass their arguments in the wrong order) is left out too."""
    import textarena as ta

    lines = []
    for sender, text, kind in messages:
        if sender == ta.GAME_ID and kind != ta.ObservationType.PLAYER_ACTION:
            lines.append(f"[GAME] {text}")
        elif type(sender) is int and sender != own and 0 <= sender < players:
            lines.append(f"[Player {sender}] {text}")
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_threshold(success_threshold: Any) -> None:
    t = success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ValueError(f"success_threshold={t}: must be a number (TextArena's reward for a win is 1)")


def _check_seat(seat: Any) -> None:
    if seat is not None and (isinstance(seat, bool) or seat not in (0, 1)):
        raise ValueError(f"seat={seat}: must be 0, 1 or null (null: seat task_id % 2)")


class TextArenaEnv:
    """A TextArena game (module docstring).

    kwargs: ``game`` (a TextArena id, e.g. ``GuessTheNumber-v0``), ``config`` (the game's own settings, passed to
    ``ta.make``), ``success_threshold`` (the reward that counts as success), ``instruction`` (the task
    description templates put in the system prompt; None: :data:`DEFAULT_INSTRUCTION`, or
    :data:`TWO_PLAYER_INSTRUCTION` for a two-player game), ``opponent`` (a two-player
    game's fixed opponent, :data:`~openmanus_rl_env_textarena.opponents.OPPONENTS`; None for a single-player game),
    ``seat`` (the model's seat in a two-player game: 0, 1, or None for ``task_id % 2``); with ``opponent=self``:
    ``val_opponent`` (the opponent of validation tasks and single episodes) and ``seat_timeout_s`` (how long a seat
    waits for the other's move).
    """

    def __init__(self, game: str = "GuessTheNumber-v0", config: Optional[Dict[str, Any]] = None,
                 success_threshold: float = 1.0, instruction: Optional[str] = None, opponent: Optional[str] = None,
                 seat: Optional[int] = None, val_opponent: Optional[str] = "random", seat_timeout_s: float = 60.0):
        _check_threshold(success_threshold)
        _check_seat(seat)
        _check_timeout(seat_timeout_s)
        self.spec = games.check(game, config, opponent=opponent)
        self.selfplay = opponent == SELF
        if self.selfplay:  # validation and single episodes play val_opponent
            _check_val_opponent(game, config, val_opponent)
        self.seat_timeout_s = float(seat_timeout_s)
        self.game_id = self.spec.id
        self.success_threshold = float(success_threshold)
        default = TWO_PLAYER_INSTRUCTION if self.spec.players == 2 else DEFAULT_INSTRUCTION
        self.instruction = default if instruction is None else str(instruction)
        self.opponent_name, self.seat = (val_opponent if self.selfplay else opponent), seat
        self._table: tables.Table | None = None  # a self-play game shared with the other seat's episode
        self._table_key: Any = None
        self._game: Any = None
        self._rng = games.Isolated()
        self._done = True
        self._own = 0  # the model's seat in the game in play
        self._opponent: Any = None

    @staticmethod
    def check_run(kwargs: Any, cfg: Any) -> None:
        """Self-play's needs of a training run (ValueError naming the key): the episodes mode, two samples a game
        (``rollout.n`` even), each actor rank's share of a batch whole games."""
        if kwargs.get("opponent") != SELF:
            return
        rollout = cfg.rollout
        if rollout.mode != "episodes":
            raise ValueError(f"rollout.mode={rollout.mode}: env.kwargs.opponent=self needs rollout.mode=episodes (a "
                             f"seat's env call waits while the other seat moves; lockstep waits for both at once)")
        if rollout.n % 2:
            raise ValueError(f"rollout.n={rollout.n}: env.kwargs.opponent=self plays one sample per seat of a "
                             f"two-player game: make rollout.n even")
        rows, ranks = cfg.data.train_batch_size * rollout.n, cfg.trainer.num_workers
        if rows % ranks or (rows // ranks) % 2:
            raise ValueError(f"trainer.num_workers={ranks}: the seats of a game play on one actor rank, and {rows} "
                             f"samples a step (data.train_batch_size x rollout.n) do not split into whole games over "
                             f"{ranks} ranks")

    # ----------------------------------------------------------------------------------- protocol
    def start_task(self, task: Any) -> str:
        """A rollout's task row. With ``opponent=self``, a training row the rollout expanded (``group_id`` and
        ``sample_index``) is seat ``sample_index % 2`` of game ``sample_index // 2`` of its group; anything else is
        :meth:`reset`."""
        index = task.get("sample_index")
        if not self.selfplay or task.get("split") == "val" or task.get("group_id") is None or index is None:
            return self.reset(task_id=task.get("task_id"), seed=task.get("seed"))
        chosen = _task_number(task.get("task_id"), task.get("seed"))
        self._leave()
        self._own = int(index) % 2
        self._table_key = (self.game_id, task["group_id"], int(index) // 2, task.get("task_id"), task.get("seed"))
        self._table = tables.TABLES.join(self._table_key, lambda: tables.Table(self.spec, chosen))
        self._wait_turn("its first move")
        self._done = False
        return render(self._table.take(self._own), self._own, 2)

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """The game TextArena deals for seed ``task_id`` (``seed`` when None; a random one when both are)."""
        chosen = _task_number(task_id, seed)
        self._leave()
        if self._game is None:
            with self._rng():
                self._game = games.make(self.spec)
        two = self.spec.players == 2
        self._own = (chosen % 2 if self.seat is None else self.seat) if two else 0
        self._opponent = OPPONENTS[self.opponent_name](chosen) if two else None
        with self._rng():
            self._game.reset(num_players=self.spec.players, seed=chosen)
            if self._state.current_player_id != self._own:
                problem = self._opponent_moves()
                if problem:  # the opponent cannot open this game: the rollout counts the episode as env_error
                    raise RuntimeError(f"textarena env: {self.game_id} task {chosen}: {problem}")
            messages = self._take()
        self._done = False
        return render(messages, self._own, self.spec.players)

    def step(self, action: str) -> StepResult:
        """Play one move (module docstring)."""
        if self._game is None and self._table is None:
            raise RuntimeError("textarena env: call reset() before step()")
        info: dict[str, Any] = {"game": self.game_id, "invalid": False}
        if self._done:  # a step after the end: answered, never raised (the protocol's step is total)
            return StepResult("The episode is over.", 0.0, True, {**info, "invalid": True})
        if self._table is not None:
            info["role"] = self.role  # the rae estimator's baseline key, and GRPO's group per seat (hooks.py)
            return self._table_step(action, info)
        state = self._state
        errors = getattr(state, "error_count", 0)
        problem = None
        try:
            with self._rng():
                done, _ = self._game.step(as_text(action))
                invalid = bool(getattr(state, "error_count", 0) > errors)
                if not done and not invalid and self._opponent is not None:
                    problem = self._opponent_moves()
                    done = bool(state.done)
                messages = self._take()
        except Exception as exc:  # noqa: BLE001  (a game's own bug on some text: the episode ends, the run goes on)
            self._done = True
            why = games.first_line(exc)
            return StepResult(f"[GAME] The game could not take this move ({why}). The game is over.", 0.0, True,
                              {**info, "invalid": True, "game_error": why, "score": 0.0, "success": False})
        outcome = state.game_info.get(self._own, {})
        info["invalid"] = invalid or bool(done and outcome.get("invalid_move"))
        info["turn"] = int(state.turn)
        text = render(messages, self._own, self.spec.players)
        if problem:
            self._done = True
            return StepResult(f"{text}\n[GAME] {problem}. The game is over.", 0.0, True,
                              {**info, "game_error": problem, "score": 0.0, "success": False})
        if not done:
            return StepResult(text, 0.0, False, info)
        with self._rng():
            rewards, _ = self._game.close()
        return self._end(text, rewards, outcome, info)

    def _end(self, text: str, rewards: Any, outcome: dict, info: dict[str, Any]) -> StepResult:
        """The end of the game for the model's seat: TextArena's reward and reason."""
        self._done = True
        value = (rewards or {}).get(self._own, 0.0)
        reward = float(value) if _is_number(value) else 0.0
        if not _is_number(value):  # 0.7.4: Countdown, Cryptarithm, Slitherlink, ThreeCardMonte swap reward and reason
            info["reward_error"] = f"TextArena gave {str(value)[:200]!r} as the reward; counted as 0"
        reason = str(outcome.get("reason") or "")
        info.update(score=reward, success=reward >= self.success_threshold, reason=reason)
        if reason:
            text = f"{text}\n[GAME] {reason}" if text else f"[GAME] {reason}"
        return StepResult(text, reward, True, info)

    def close(self) -> None:
        if self._table is not None and not self._done:  # a seat that leaves mid-game frees the other's wait
            self._table.give_up(self._own)
        self._leave()
        self._done = True

    # ----------------------------------------------------------------------------------- self-play
    @property
    def role(self) -> str:
        """The game and the seat (``TicTacToe-v0:seat1``)."""
        return f"{self.game_id}:seat{self._own}"

    def _leave(self) -> None:
        if self._table is not None:
            tables.TABLES.leave(self._table_key, self._table, 2)
            self._table = None

    def _wait_turn(self, what: str) -> None:
        if not self._table.wait_turn(self._own, self.seat_timeout_s):
            raise RuntimeError(
                f"textarena env: seat {self._own} of a {self.game_id} game waited {self.seat_timeout_s:g}s for the "
                f"other seat before {what}; opponent=self needs rollout.mode=episodes, rollout.n even (one episode "
                f"per seat), and both seats of a game on one actor rank")

    def _table_step(self, action: str, info: dict[str, Any]) -> StepResult:
        """Self-play: play the move at the shared game, then wait for this seat's next turn or the end."""
        table = self._table
        invalid = False
        if not table.over:  # else the game ended before this seat's move: its result, whatever the reply
            try:
                invalid = table.play(self._own, as_text(action))
            except Exception as exc:  # noqa: BLE001  (a game's own bug on some text: this game ends, the run goes on)
                self._done = True
                why = games.first_line(exc)
                return StepResult(f"[GAME] The game could not take this move ({why}). The game is over.", 0.0, True,
                                  {**info, "invalid": True, "game_error": why, "score": 0.0, "success": False})
            self._wait_turn("its next move")
        state = table.state
        outcome = state.game_info.get(self._own, {})
        text = render(table.take(self._own), self._own, 2)
        info["turn"] = int(state.turn)
        if table.forfeit is not None:  # the other seat left the game
            self._done = True
            return StepResult(f"{text}\n[GAME] Player {table.forfeit} left the game. The game is over.".lstrip(),
                              0.0, True, {**info, "forfeit_by": table.forfeit, "score": 0.0, "success": False})
        info["invalid"] = invalid or bool(state.done and outcome.get("invalid_move"))
        if not state.done:
            return StepResult(text, 0.0, False, info)
        return self._end(text, table.final_rewards(), outcome, info)

    # ----------------------------------------------------------------------------------- extras
    @property
    def _state(self) -> Any:
        return self._game.state

    def _take(self) -> list:
        """The messages sent to the model's seat since the last call (TextArena keeps one queue per player)."""
        queues = self._state.observations
        messages, queues[self._own] = queues[self._own], []
        return messages

    def _opponent_moves(self) -> str | None:
        """The opponent plays until the model is to play or the game ends (under the game's random state); a
        problem that ends the episode, or None."""
        state, refused = self._state, set()
        for _ in range(MAX_OPPONENT_MOVES):
            if state.done or state.current_player_id == self._own:
                return None
            seat = state.current_player_id
            texts = [text for _, text, _ in state.observations[seat]]
            move = self._opponent.pick(texts, refused)
            if move is None:
                return f"the opponent ({self.opponent_name}) has no move left that the game takes"
            errors = state.error_count
            self._game.step(move)
            if not state.done and state.current_player_id == seat and state.error_count > errors:
                refused.add(move)  # refused: the same messages, and another listed move
                continue
            refused = set()
            state.observations[seat] = []
        return f"the opponent made {MAX_OPPONENT_MOVES} moves without the model's turn coming"

    @property
    def _bare(self) -> Any:
        import textarena as ta

        env = self._game
        while isinstance(env, ta.Wrapper):
            env = env.env
        return env

    @property
    def oracle_action(self):
        """The solver's next move (``oracle_action()``), present only for games that have one
        (:data:`~openmanus_rl_env_textarena.oracles.ORACLES`)."""
        if self.spec.cls not in ORACLES:
            raise AttributeError(f"TextArena's {self.game_id} ({self.spec.cls}) has no solver here, so the env has no "
                                 f"oracle (games with one: {', '.join(sorted(ORACLES))})")
        return self._oracle_action

    def _oracle_action(self) -> str:
        if self._game is None or self._done:
            raise RuntimeError("textarena env: oracle_action() needs a game in play (reset() first)")
        return ORACLES[self.spec.cls](self._bare)


SELF = "self"
"""The policy plays both seats of a two-player game, each seat its own episode (:mod:`.tables`)."""


def _check_timeout(seat_timeout_s: Any) -> None:
    t = seat_timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise ValueError(f"seat_timeout_s={t!r}: must be a positive number of seconds")


def _check_val_opponent(game: Any, config: Any, val_opponent: Any) -> None:
    if val_opponent == SELF:
        raise ValueError("val_opponent=self: validation plays a fixed opponent; choose " + ", ".join(OPPONENTS))
    try:
        games.check(game, config, quiet=True, opponent=val_opponent)
    except ValueError as exc:  # the same line, about the key that holds the bad value
        raise ValueError("val_" + str(exc) if str(exc).startswith("opponent=") else str(exc)) from None


def _task_number(task_id: Any, seed: Any) -> int:
    """The seed a game is dealt from: ``task_id``, else ``seed``, else a random one."""
    for name, value in (("task_id", task_id), ("seed", seed)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError(f"textarena env: {name} must be an int, got {type(value).__name__} {value!r}")
    chosen = task_id if task_id is not None else seed
    return int(chosen) if chosen is not None else random.SystemRandom().randrange(2**31)


def _kwargs_dataclass() -> type:
    """``env.kwargs``, checked before the run starts: the fields and defaults are the constructor's; building it
    checks the game id (unknown, multi-player, or not startable here) and its settings, in one line each."""
    params = [p for p in inspect.signature(TextArenaEnv.__init__).parameters.values() if p.name != "self"]
    hints = typing.get_type_hints(TextArenaEnv.__init__)
    fields = [(p.name, hints[p.name], dataclasses.field(default=p.default)) for p in params]

    def __post_init__(self) -> None:
        _check_threshold(self.success_threshold)
        _check_seat(self.seat)
        _check_timeout(self.seat_timeout_s)
        games.check(self.game, self.config, quiet=True, opponent=self.opponent)
        if self.opponent == SELF:
            _check_val_opponent(self.game, self.config, self.val_opponent)

    return dataclasses.make_dataclass("Kwargs", fields, namespace={"__post_init__": __post_init__})


TextArenaEnv.Kwargs = _kwargs_dataclass()
