"""TextWorld game files: generated offline with ``tw-make``, cached on disk, one per task id.

Game ``task_id`` is ``tw-make <challenge> <make_args...> --seed <task_id>``, stored as
``<games_dir>/game_<task_id>.z8`` next to its ``game_<task_id>.json`` (the json carries the quest, the
walkthrough and the logic TextWorld needs for ``admissible_commands``, ``policy_commands`` and ``won``).

The default ``games_dir`` is ``$XDG_CACHE_HOME/openmanus_rl/textworld/<settings hash>/`` (``~/.cache`` when
unset), the hash covering the challenge, its arguments and the TextWorld version, so a change of settings
never picks up a stale game.

Concurrency: many rollout workers (threads or processes, on one machine or a shared disk) may ask for the
same missing game at once. ``tw-make`` writes into a private temporary folder inside ``games_dir``; the
json and then the z8 are moved into place with :func:`os.replace` (atomic on one filesystem), and the z8 is
the marker of a complete game. An advisory ``flock`` per game keeps two workers from generating the same
game twice where the platform has one; without it the result is still correct, only the work is doubled.

Timing (measured on the project's 2-core CPU machine, TextWorld 1.7.0): one ``custom --world-size 2
--nb-objects 3 --quest-length 2`` game takes 2.0-2.6 s through ``tw-make`` on an idle machine (about 0.6 s
of it is importing textworld; in-process ``textworld.make`` took 1.8-2.8 s) and 4-7 s on a loaded one; a
``tw-simple`` game takes 3.8 s idle, 9-12 s loaded. Loading a cached game takes ~0.16 s, a reset of the
same game ~0.01 s, a step ~2 ms. Pre-generate a training set with
``python -m openmanus_rl_env_textworld.games 0-255 --workers 2`` to keep that out of the first rollouts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

try:  # POSIX only; elsewhere concurrent workers may generate a game twice (still correctly).
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

DEFAULT_CHALLENGE = "custom"
DEFAULT_MAKE_ARGS: dict[str, Any] = {"world_size": 2, "nb_objects": 3, "quest_length": 2}


class GameGenerationError(RuntimeError):
    """``tw-make`` failed (bad settings, no quest possible, a missing Inform 7 compiler)."""


def textworld_version() -> str:
    try:
        from importlib.metadata import version

        return version("textworld")
    except Exception:  # not installed: the env fails later with a clearer error
        return "unknown"


def settings_hash(challenge: str, make_args: Mapping[str, Any]) -> str:
    """12 hex digits of sha256 over the challenge, its arguments and the TextWorld version."""
    payload = json.dumps({"challenge": challenge, "make_args": dict(make_args), "textworld": textworld_version()},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def default_games_dir(challenge: str, make_args: Mapping[str, Any]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    return cache / "openmanus_rl" / "textworld" / settings_hash(challenge, make_args)


def make_args_to_cli(make_args: Mapping[str, Any]) -> list[str]:
    """``{"world_size": 2, "include_adj": True, "theme": None}`` -> ``["--world-size", "2", "--include-adj"]``.

    ``True`` is a bare flag, ``False``/``None`` leave the option out, a list repeats the value.
    ``seed``/``output`` are set per game and may not appear here.
    """
    out: list[str] = []
    for key, value in make_args.items():
        flag = "--" + str(key).replace("_", "-")
        if flag in ("--seed", "--output"):
            raise ValueError(f"make_args may not set {key!r}: the seed is the task id and the output is the cache; "
                             f"remove it from make_args")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def tw_make_command() -> list[str]:
    """How to run ``tw-make``: with this interpreter, so the venv's TextWorld is the one used."""
    beside = Path(sys.executable).parent / "tw-make"
    found = str(beside) if beside.is_file() else shutil.which("tw-make")
    if not found:
        raise GameGenerationError("tw-make was not found next to the Python interpreter nor on PATH; "
                                  "install TextWorld (`pip install textworld`) in this environment")
    return [sys.executable, found]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (flock: excludes other processes and other open() in threads)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class GameCache:
    """Game files for task ids, generated on demand into ``games_dir``."""

    def __init__(self, games_dir: str | os.PathLike | None = None, challenge: str = DEFAULT_CHALLENGE,
                 make_args: Mapping[str, Any] | None = None, timeout_s: float = 600.0):
        self.challenge = str(challenge)
        self.make_args = dict(DEFAULT_MAKE_ARGS if make_args is None else make_args)
        self._cli = make_args_to_cli(self.make_args)  # fail on bad make_args at construction, not at reset
        self.games_dir = Path(games_dir).expanduser() if games_dir else default_games_dir(self.challenge, self.make_args)
        self.timeout_s = float(timeout_s)

    def path(self, seed: int) -> Path:
        return self.games_dir / f"game_{int(seed)}.z8"

    def exists(self, seed: int) -> bool:
        z8 = self.path(seed)
        return z8.is_file() and z8.with_suffix(".json").is_file()

    def get(self, seed: int) -> Path:
        """The z8 file of game ``seed``, generating it first if it is missing."""
        seed = int(seed)
        if seed < 0:
            raise ValueError(f"task_id={seed}: generated TextWorld games need a task id >= 0 (it is tw-make's seed)")
        if not self.exists(seed):
            self.games_dir.mkdir(parents=True, exist_ok=True)
            with _locked(self.games_dir / f".game_{seed}.lock"):
                if not self.exists(seed):  # another worker may have made it while we waited
                    self._generate(seed)
        return self.path(seed)

    def command(self, seed: int, output: Path) -> list[str]:
        return [*tw_make_command(), self.challenge, *self._cli, "--seed", str(int(seed)),
                "--output", str(output), "--silent"]

    def _generate(self, seed: int) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp_game_{seed}_", dir=self.games_dir))
        try:
            out = tmp / f"game_{seed}.z8"
            cmd = self.command(seed, out)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s,
                                      stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as exc:
                raise GameGenerationError(f"tw-make did not finish in {self.timeout_s:.0f} s: {' '.join(cmd)}; "
                                          f"use smaller settings or raise generate_timeout_s") from exc
            made_json = out.with_suffix(".json")
            if proc.returncode != 0 or not out.is_file() or not made_json.is_file():
                tail = (proc.stderr or proc.stdout or "").strip()[-2000:]
                raise GameGenerationError(f"tw-make failed (exit {proc.returncode}) for game {seed}: "
                                          f"{' '.join(cmd)}\n{tail}")
            final = self.path(seed)
            # json first: a z8 in place means a complete game (see exists()).
            os.replace(made_json, final.with_suffix(".json"))
            os.replace(out, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def pregenerate(self, seeds: Sequence[int], workers: int = 1) -> list[Path]:
        """Generate every missing game in ``seeds`` (``workers`` tw-make processes at a time)."""
        with ThreadPoolExecutor(max_workers=max(1, int(workers))) as pool:
            return list(pool.map(self.get, seeds))


def _parse_ids(spec: str) -> list[int]:
    """``"0-9,20,30-31"`` -> ``[0..9, 20, 30, 31]``."""
    ids: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            ids += range(int(lo), int(hi) + 1)
        elif part:
            ids.append(int(part))
    return ids


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m openmanus_rl_env_textworld.games 0-255 [--games-dir D] [--challenge C] [--make-args JSON]``."""
    p = argparse.ArgumentParser(prog="python -m openmanus_rl_env_textworld.games",
                                description="Pre-generate TextWorld games for task ids into the env's cache.")
    p.add_argument("ids", help="task ids, e.g. 0-255 or 0-9,20")
    p.add_argument("--games-dir", default=None, help="default: the env's cache folder for these settings")
    p.add_argument("--challenge", default=DEFAULT_CHALLENGE)
    p.add_argument("--make-args", default=None, help=f"JSON object of tw-make options (default {DEFAULT_MAKE_ARGS})")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    cache = GameCache(args.games_dir, args.challenge, json.loads(args.make_args) if args.make_args else None)
    ids = _parse_ids(args.ids)
    start = time.perf_counter()
    missing = [i for i in ids if not cache.exists(i)]
    cache.pregenerate(missing, args.workers)
    took = time.perf_counter() - start
    print(f"{len(ids)} games in {cache.games_dir} ({len(missing)} generated in {took:.1f} s"
          f"{f', {took / len(missing):.2f} s each' if missing else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
