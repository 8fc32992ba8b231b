"""``textworld``: TextWorld text-adventure games as an openmanus-rl :class:`~openmanus_rl_core.protocols.Env`.

TextWorld's gym API is the old 4-tuple ``(obs, score, done, infos)`` and ``score`` is cumulative; this env
turns it into per-step rewards (``reward_t = score_t - score_{t-1}``, so an episode's rewards sum to its
final score, ``max_score`` for a won game).

What the interpreter must never see: the Z-machine interpreter (Jericho's dumb-frotz) hangs on a NUL byte
and segfaults the whole process on ``"a\\x00b"``; a backslash starts a dumb-frotz escape (``\\q``,
``\\help``) that hangs it; a newline splits one action into two game inputs and puts the game out of step
with the text the model sent; ``restart``/``restore``/``quit`` reset or stop the game behind TextWorld's
state tracker (after ``restart``, ``won`` came back true with score 0); ``look. south``, ``look, south`` and
``look then south`` run two commands, of which the reply and the tracker see only the first. So an action
is cleaned before it is sent: whitespace runs become one space and trailing ``.!?`` go; an action with a
backslash or anything else outside printable ASCII, one longer than ``max_action_chars`` (Jericho cuts
input at 198 bytes), one that chains commands (``.``, ``,``, ``then``), or one with any of those meta words
(or TextWorld's ``tw-*`` debug commands) anywhere in it is refused with an observation that says why and
``info["invalid"] = True``.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_textworld.games import DEFAULT_CHALLENGE, GameCache

INSTRUCTION = (
    "You are playing a text adventure game. The first observation states your objective. Each turn, send "
    "exactly one short command in the imperative, such as: look, inventory, go north, examine desk, "
    "take key, take key from box, open box, unlock door with key, put apple on table, insert coin into slot. "
    "You earn points for the steps of the objective; the game ends when it is completed."
)

# Inform 7 words that reset, stop, save or replay the game behind TextWorld's state tracking.
META_WORDS = frozenset({"quit", "q", "die", "restart", "restore", "save", "load", "undo", "script", "transcript",
                        "unscript", "noscript"})

# How the Inform 7 parser says it did not understand (the first sentence of its reply).
PARSER_ERRORS = (
    "that's not a verb i recognise",
    "i beg your pardon",
    "you can't see any such thing",
    "i didn't understand",
    "i only understood you as far as",
    "you seem to have said too little",
    "you seem to want to talk to someone",
    "you can't use multiple objects with that verb",
    "that noun did not make sense in this context",
    "you excepted something not included anyway",
    "that's not something you need to refer to",
    "you must supply a noun",
    "you must name something more substantial",
)

# Jericho warns on loading every TextWorld game that it cannot read its score itself; TextWorld tracks the
# score, so the warning says nothing here and would repeat at every reset.
warnings.filterwarnings("ignore", message=r"Game .* is not fully supported", module="jericho")

_WORD = re.compile(r"[a-z0-9][a-z0-9-]*")
_PROMPT_LINE = re.compile(r"\n>[^\n]*\Z")  # the interpreter's '>' prompt, padded, then the status line
_BANNER = re.compile(r"\A(?:[ _|$\\/<>]*\n)+")  # leading lines made only of the banner's drawing characters
_END_MENU = re.compile(r"\n?Would you like to RESTART, RESTORE a saved game[^\n]*")


def clean_action(action: Any, max_chars: int) -> tuple[str, str | None]:
    """``(command, None)`` to send, or ``("", reason)`` when the action must not reach the interpreter."""
    if not isinstance(action, str):
        action = str(action)
    command = " ".join(action.split())  # every unicode whitespace run (\n, \r, \t, nbsp, ...) -> one space
    if not command:
        return "", "You did not type a command."
    if len(command) > max_chars:
        return "", f"That command is too long ({len(command)} characters; the limit is {max_chars})."
    bad = sorted({c for c in command if not " " <= c <= "~" or c == "\\"})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        return "", f"That command has characters the game cannot read ({shown}); use plain ASCII text."
    # Inform runs "a. b", "a, b" and "a then b" as two commands, but the reply (and TextWorld's tracking of
    # the game state) covers only the first: the second moves the game behind the tracker's back.
    command = command.rstrip(" .!?") or command
    words = _WORD.findall(command.lower())
    if "." in command or "," in command or "then" in words:
        return "", "Send one command at a time (no '.', ',' or 'then' between commands)."
    blocked = sorted({w for w in words if w in META_WORDS or w.startswith("tw-")})
    if blocked:
        return "", f"The command {', '.join(map(repr, blocked))} is not available in this game."
    return command, None


def clean_observation(text: str, objective: str | None = None) -> str:
    """Drop the opening ASCII-art banner, the trailing prompt/status line, the end-of-game menu and padding."""
    if objective and objective in text:
        text = text[text.index(objective):]
    else:  # no objective shown (e.g. tw-simple --goal none): drop the banner's lines of ASCII art
        text = _BANNER.sub("", text)
    text = _PROMPT_LINE.sub("", text.rstrip())
    text = _END_MENU.sub("", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _resolve_game_files(game_files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """A folder (its ``*.z8``), a glob pattern, a file, or a list of those -> sorted z8 paths with their json."""
    items = [game_files] if isinstance(game_files, (str, os.PathLike)) else list(game_files)
    paths: list[Path] = []
    for item in items:
        p = Path(item).expanduser()
        if p.is_dir():
            found = sorted(p.glob("*.z8"))
        elif any(ch in str(item) for ch in "*?["):
            found = sorted(Path(f) for f in glob.glob(str(p)) if f.endswith(".z8"))  # not the .json/.ni beside
        else:
            found = [p]
        if not found:
            raise ValueError(f"game_files entry {str(item)!r} matched no game file; give .z8 files, a folder of "
                             f"them or a glob pattern")
        paths += found
    for p in paths:
        if not p.is_file():
            raise ValueError(f"game file {str(p)!r} does not exist")
        if not p.with_suffix(".json").is_file():
            raise ValueError(f"game file {str(p)!r} has no {p.with_suffix('.json').name} beside it; this env "
                             f"needs TextWorld games made by tw-make (the json carries the quest and its logic)")
    return paths


class TextWorldEnv:
    """One TextWorld game per task id.

    Task ids: with ``game_files``, task ``t`` plays ``files[t % len(files)]`` (a list in its order, a folder or glob
    sorted; ``num_tasks = len(files)``). Otherwise game ``t`` is generated by ``tw-make <challenge> <make_args> --seed t`` into
    ``games_dir`` on first use (see :mod:`openmanus_rl_env_textworld.games`); ``num_tasks`` (optional) wraps
    ids. ``reset(task_id=None, seed=s)`` plays task ``s`` (0 when both are None). A game is deterministic,
    so ``seed`` does not change it otherwise.

    Observation: the game's text (banner, prompt and status line removed when ``clean_observation``), then,
    with ``show_admissible``, ``"Admissible commands: a, b, c"``.

    ``step`` returns ``reward = score delta`` and ``info`` with ``score`` (cumulative), ``max_score``, ``won``,
    ``lost``, ``success`` (= won), ``moves``, ``admissible_commands``, ``invalid`` (refused, failed, or the
    parser did not understand), ``task_id`` and ``game_file``. ``done`` is the game's own (won or lost).
    """

    instruction = INSTRUCTION

    def __init__(
        self,
        game_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
        games_dir: str | os.PathLike | None = None,
        challenge: str = DEFAULT_CHALLENGE,
        make_args: Mapping[str, Any] | None = None,
        show_admissible: bool = False,
        num_tasks: int | None = None,
        max_action_chars: int = 190,
        clean_observation: bool = True,
        generate_timeout_s: float = 600.0,
    ):
        # Construction stays cheap (no game is generated or loaded): `openmanus-rl data make` builds the env
        # only to read num_tasks.
        import textworld  # noqa: F401  -- fail here, naming the missing dependency, not at the first reset

        self.show_admissible = bool(show_admissible)
        self.max_action_chars = int(max_action_chars)
        self.clean = bool(clean_observation)
        if game_files is not None:
            self.files: list[Path] | None = _resolve_game_files(game_files)
            self.cache: GameCache | None = None
            self.num_tasks: int | None = len(self.files)
        else:
            self.files = None
            self.cache = GameCache(games_dir, challenge, make_args, generate_timeout_s)
            if num_tasks is not None and int(num_tasks) < 1:
                raise ValueError(f"num_tasks={num_tasks} must be >= 1 (or null for unbounded generated games)")
            self.num_tasks = int(num_tasks) if num_tasks is not None else None
        self._gym: Any = None
        self._gym_file: Path | None = None
        self._infos: dict[str, Any] = {}
        self._score = 0.0
        self._done = True
        self._task_id: int | None = None

    # ------------------------------------------------------------------------------------- games
    def game_file(self, task_id: int) -> Path:
        """The z8 file task ``task_id`` plays (generated now if it is missing)."""
        if self.files is not None:
            return self.files[int(task_id) % len(self.files)]
        if self.num_tasks:
            task_id = int(task_id) % self.num_tasks
        return self.cache.get(int(task_id))

    def _request_infos(self):
        from textworld import EnvInfos

        return EnvInfos(admissible_commands=True, max_score=True, won=True, lost=True, policy_commands=True,
                        objective=True, score=True, moves=True)

    # --------------------------------------------------------------------------------------- env
    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        if task_id is None:
            task_id = int(seed or 0)
        path = self.game_file(task_id)
        if self._gym is None or self._gym_file != path:
            from textworld.gym.envs import TextworldGymEnv

            self._close_game()
            self._gym = TextworldGymEnv([str(path)], request_infos=self._request_infos())
            self._gym_file = path
        obs, infos = self._gym.reset()  # reloads the game: the initial state every time
        self._task_id = int(task_id)
        self._infos = dict(infos)
        self._score = float(infos.get("score") or 0)
        self._done = False
        return self._render(obs)

    def step(self, action: str) -> StepResult:
        if self._gym is None:
            return StepResult("No game is running; call reset() first.", 0.0, True,
                              self._info(invalid=True, error="step() before reset()"))
        if self._done:
            return StepResult("The game is over.", 0.0, True, self._info(invalid=False))
        command, refusal = clean_action(action, self.max_action_chars)
        if refusal is not None:
            return StepResult(self._with_admissible(refusal), 0.0, False, self._info(invalid=True))
        try:
            obs, score, done, infos = self._gym.step(command)
        except Exception as exc:  # the interpreter may fail on input we did not foresee: answer, never raise
            return StepResult(self._with_admissible(f"The command {command!r} failed ({type(exc).__name__}: {exc})."),
                              0.0, False, self._info(invalid=True, error=f"{type(exc).__name__}: {exc}"))
        self._infos = dict(infos)
        score = float(score or 0)
        reward, self._score = score - self._score, score
        self._done = bool(done or infos.get("won") or infos.get("lost"))
        text = self._render(obs)
        invalid = text.lower().startswith(PARSER_ERRORS)
        return StepResult(text, reward, self._done, self._info(invalid=invalid, command=command))

    def oracle_action(self) -> str:
        """The next command of TextWorld's winning policy from the current state (``"look"`` when it has none)."""
        if self._gym is None:
            raise RuntimeError("oracle_action() before reset(): no game is running")
        policy = self._infos.get("policy_commands") or []
        return str(policy[0]) if policy else "look"

    def close(self) -> None:
        self._close_game()
        self._done = True

    # ----------------------------------------------------------------------------------- helpers
    def _close_game(self) -> None:
        gym, self._gym, self._gym_file = self._gym, None, None
        if gym is not None:
            try:
                gym.close()
            except Exception:  # closing a dead interpreter: nothing left to release
                pass

    def _render(self, obs: str) -> str:
        text = clean_observation(obs, self._infos.get("objective")) if self.clean else obs
        return self._with_admissible(text)

    def _with_admissible(self, text: str) -> str:
        if not self.show_admissible or self._done:
            return text
        commands = self._infos.get("admissible_commands") or []
        return f"{text}\n\nAdmissible commands: {', '.join(commands)}"

    def _info(self, invalid: bool, **extra: Any) -> dict[str, Any]:
        won = bool(self._infos.get("won"))
        return {
            "score": self._score,
            "max_score": float(self._infos.get("max_score") or 0),
            "won": won,
            "lost": bool(self._infos.get("lost")),
            "success": won,
            "moves": int(self._infos.get("moves") or 0),
            "admissible_commands": list(self._infos.get("admissible_commands") or []),
            "invalid": bool(invalid),
            "task_id": self._task_id,
            "game_file": str(self._gym_file) if self._gym_file else None,
            **extra,
        }

    def __del__(self) -> None:  # an env dropped without close() must not leave an interpreter behind
        try:
            self._close_game()
        except Exception:
            pass
