"""Which TextArena game an env plays: the id and its settings checked before a run starts (one line naming the
value), the game built with only its action wrappers, and each game's random numbers kept to itself.

TextArena (PyPI ``textarena``) registers its games by id (``ta.make(id)``); an id names a game class, its settings
and wrappers (variants such as ``-raw`` and ``-train`` change only the wrappers). A game draws its random numbers
from Python's global ``random`` module, seeded by ``reset(seed=...)``, and some draw more while they are played
(Blackjack's cards, Minesweeper's mines on the first move, 2048's new tiles). The rollout steps many envs at once on
threads, so :class:`Isolated` gives each game its own ``random`` state: every call into TextArena holds one process
lock, swaps the game's state in and the caller's back out. A game then plays exactly as TextArena plays it alone in
a fresh process after ``reset(seed=...)``.

``textarena`` is imported on first use (about 1 s): listing plugins never pays for it.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import io
import json
import os
import random
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["Game", "check", "make", "game_ids", "Isolated", "SINGLE_PLAYER_EXAMPLES", "TWO_PLAYER_EXAMPLES",
           "first_line"]

# Single-player ids of textarena 0.7.4 that run offline here (no NLTK corpus, no API key); the docs list them all.
SINGLE_PLAYER_EXAMPLES = ("GuessTheNumber-v0", "TowerOfHanoi-v0", "Minesweeper-v0-small", "Blackjack-v0",
                          "FrozenLake-v0", "Mastermind-v0")
# Two-player ids whose messages list each turn's moves, so a fixed opponent (opponents.py) can play them.
TWO_PLAYER_EXAMPLES = ("TicTacToe-v0", "Othello-v0", "SimpleTak-v0", "WildTicTacToe-v0")

_LOCK = threading.RLock()  # one call into TextArena at a time: its games share Python's global random module


def plain(value: Any) -> Any:
    """OmegaConf containers (and any mapping or list) as plain dicts and lists."""
    if hasattr(value, "_get_node"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def first_line(exc: BaseException) -> str:
    """``Type: the first non-empty line of the message`` (NLTK's errors span a dozen lines)."""
    lines = [x.strip(" *") for x in str(exc).splitlines() if x.strip(" *")]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def _show(value: Any) -> str:
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


def _registry() -> dict[str, Any]:
    # The package's import registers every game; the registry module is whole before that ends, so envs built on
    # threads (rollout.mode=episodes) would read it part-filled unless the package import comes first, once.
    with _LOCK:
        import textarena  # noqa: F401
        from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def game_ids() -> list[str]:
    """Every id the installed TextArena registers (single- and multi-player, offline or not)."""
    return sorted(_registry())


class Isolated:
    """Python's ``random`` state of one game: ``with isolated:`` runs TextArena code with it (under the process
    lock) and keeps what the code left in it, restoring the caller's state afterwards."""

    def __init__(self) -> None:
        self._state = random.Random(0).getstate()  # what a constructor draws is the same in every process

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with _LOCK:
            outer = random.getstate()
            random.setstate(self._state)
            try:
                yield
            finally:
                self._state = random.getstate()
                random.setstate(outer)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Nothing printed while a game is tried out by the config check (NLTK prints its failed downloads to the
    stderr it saw at import, so the file descriptors are silenced too)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@dataclass(frozen=True)
class Game:
    """A checked game: its id, its settings (sorted JSON), the name of its TextArena class, its players (1, or 2
    against a fixed opponent)."""

    id: str
    config: str
    cls: str
    players: int = 1

    def settings(self) -> dict[str, Any]:
        return json.loads(self.config)


def make(game: Game) -> Any:
    """The TextArena game: ``ta.make(id, **settings)``'s game wrapped in the id's action wrappers only (e.g.
    ``ActionFormattingWrapper``, which adds the brackets a bare move lacks). Its observation wrappers are left
    out: they re-send the whole history every turn, and the rollout already keeps the conversation."""
    import textarena as ta

    spec = _registry()[game.id]
    env = ta.make(game.id, **game.settings())
    while isinstance(env, ta.Wrapper):
        env = env.env
    for wrapper in spec.default_wrappers or []:
        if issubclass(wrapper, ta.ActionWrapper):
            env = wrapper(env)
    return env


def _game_class(game_id: str) -> type:
    import importlib

    entry = _registry()[game_id].entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        return getattr(importlib.import_module(module), name)
    return entry


def _unknown_game(game: Any) -> ValueError:
    ids = game_ids()
    close = difflib.get_close_matches(str(game), ids, n=3, cutoff=0.6)
    if not close:  # a prefix or another case: "guessthenumber", "TowerOfHanoi"
        low = str(game).lower()
        close = [i for i in ids if i.lower().startswith(low) or low.startswith(i.lower().split("-v")[0])][:3]
    hint = (f"did you mean {' or '.join(close)}?" if close else
            f"TextArena has {len(ids)} ids, e.g. the single-player {', '.join(SINGLE_PLAYER_EXAMPLES[:4])}")
    return ValueError(f"game={game}: not a TextArena game id; {hint}")


def _check_settings(game_id: str, cls: type, settings: dict[str, Any]) -> None:
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    names = [n for n in params if n != "self"]
    for key, value in settings.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"its settings: {', '.join(names) or 'none'}"
            raise ValueError(f"config.{key}={_show(value)}: not a setting of TextArena's {game_id} "
                             f"({cls.__name__}); {hint}")


def _players(env: Any, isolated: Isolated, state: Any) -> str | None:
    """How many players a game that is not single-player wants, in words ("a two-player game"); None when it
    starts with no number of players (its settings are wrong: the caller names the error of one player)."""
    import textarena as ta

    if state is None:  # one player refused: try more
        for n in range(2, 16):
            try:
                with isolated():
                    env.reset(num_players=n, seed=0)
            except Exception:  # noqa: BLE001  (each game asserts its own player count)
                continue
            state = env.state
            break
    if state is None:
        return None
    if isinstance(state, ta.TwoPlayerState):
        return "a two-player game"
    return f"a game for {state.num_players} or more players" if state.num_players > 1 else "a multi-player game"


@lru_cache(maxsize=32)
def _check(game_id: str, config: str, quiet: bool, opponent: str | None) -> Game:
    settings = json.loads(config)
    if game_id not in _registry():
        raise _unknown_game(game_id)
    import textarena as ta

    def cant(exc: BaseException, built: bool = True) -> ValueError:
        why = first_line(exc)
        if isinstance(exc, LookupError) and "nltk" in str(exc).lower():
            why += " (NLTK data this machine does not have)"
        if settings and built:  # the class was found: the settings are the likelier cause
            return ValueError(f"config={_show(settings)}: TextArena's {game_id} does not start with these settings "
                              f"({why})")
        return ValueError(f"game={game_id}: TextArena cannot start this game here ({why}); env=textarena plays games "
                          "that need no download or API key, e.g. " + ", ".join(SINGLE_PLAYER_EXAMPLES[:4]))

    with _quiet() if quiet else contextlib.nullcontext():
        try:
            cls = _game_class(game_id)
        except Exception as exc:  # noqa: BLE001  (0.7.4: NLTK data missing, syntax errors, a missing 'gym')
            raise cant(exc, built=False) from None
        _check_settings(game_id, cls, settings)
        isolated = Isolated()
        try:
            with isolated():
                env = make(Game(game_id, config, cls.__name__))
        except Exception as exc:  # noqa: BLE001  (NLTK data, an API key, a setting the game refuses)
            raise cant(exc) from None
        try:
            with isolated():
                env.reset(num_players=1, seed=0)
            state, error = env.state, None
        except Exception as exc:  # noqa: BLE001  (a game for several players asserts its count)
            state, error = None, exc
        if isinstance(state, ta.SinglePlayerState):
            if opponent is not None:
                raise ValueError(f"opponent={opponent}: {game_id} is a single-player game of TextArena; leave "
                                 "env.kwargs.opponent unset (null)")
            return Game(game_id, config, cls.__name__)
        players = _players(env, isolated, state)
        if players is None:
            raise cant(error) from None
        if players != "a two-player game":
            raise ValueError(f"game={game_id}: {players} of TextArena; env=textarena plays single-player games, and "
                             "two-player games against a fixed opponent, e.g. " + ", ".join(TWO_PLAYER_EXAMPLES[:2]))
        if opponent is None:
            raise ValueError(f"game={game_id}: a two-player game of TextArena; name the opponent the model plays "
                             "against: env.kwargs.opponent=random (a random move among those the game lists)")
        from openmanus_rl_env_textarena.opponents import listed_moves

        with isolated():
            env.reset(num_players=2, seed=0)
            first = env.state.observations[env.state.current_player_id]
        if opponent != "self" and not listed_moves([text for _, text, _ in first]):  # self: the policy reads them
            raise ValueError(f"game={game_id}: its messages list no moves (no 'Available Moves: [...]' line), so "
                             f"opponent={opponent} cannot play it; two-player games that list them: "
                             + ", ".join(TWO_PLAYER_EXAMPLES))
    return Game(game_id, config, cls.__name__, players=2)


def check(game: Any, config: Any = None, quiet: bool = False, opponent: Any = None) -> Game:
    """Check the env's game keys and return the :class:`Game`. Raises ``ValueError`` whose message starts with
    the offending key (``game=...``, ``config.num_disk=...``, ``opponent=...``), as the config check prints it after
    ``env.kwargs.``. The game is built and reset (seed 0) to learn that it starts here and is single-player, or
    two-player with an ``opponent`` that can read its moves; the result is cached per process. ``quiet``: nothing is
    printed meanwhile, not even by what writes to the file descriptors (the config check's one line stays the only
    one; an env built on a thread leaves them alone)."""
    from openmanus_rl_env_textarena.opponents import OPPONENTS

    if opponent is not None and opponent not in OPPONENTS and opponent != "self":
        raise ValueError(f"opponent={_show(opponent)}: not an opponent; choose {', '.join(OPPONENTS)}, self (or null "
                         "for a single-player game)")
    game, config = plain(game), plain(config)
    if config is None:
        config = {}
    if not isinstance(game, str) or not game:
        raise ValueError(f"game={_show(game)}: required: a TextArena game id, e.g. "
                         + ", ".join(SINGLE_PLAYER_EXAMPLES[:4]))
    if not isinstance(config, Mapping):
        raise ValueError(f"config={_show(config)}: must be a mapping of the game's settings, e.g. "
                         "env.kwargs.config={num_disks:4}")
    return _check(game, json.dumps(config, sort_keys=True, default=str), bool(quiet), opponent)
