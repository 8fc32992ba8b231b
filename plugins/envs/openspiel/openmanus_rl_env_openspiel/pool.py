"""``opponent=pool``: earlier policies of this run as the opponents, league style.

A pool member is a frozen copy of the policy's *behaviour*, not of its weights: at a validation whose step is a
multiple of ``refresh_steps``, the driver already scores every legal action at every information state of the game
for the exploitability (:class:`~openmanus_rl_env_openspiel.exploitability.ModelPolicy`); that table of
``pi(a | s)`` is written to ``<pool_dir>/step_<S>.json`` (a *snapshot*; ``env.kwargs.pool_dir``, a folder the driver
and the workers share: by default ``<run_dir>/pool``, :func:`default_dir`). A pool seat samples its move from a
snapshot's probabilities at its information state, so it needs no model and no engine: the games whose
information states can be enumerated (:data:`POOL_GAMES`) are supported, any other is refused in one line.

Which snapshot plays: an episode of training step ``t`` (read from the rollout's group id ``<t>:<i>``) draws, from a
generator seeded by the task, ``t // refresh_steps`` and the seat, one of the last ``pool_size`` snapshots taken
before step ``t``. A snapshot of step ``S`` is only drawn from step ``S + 1`` on, so a run resumed from its
checkpoint at step ``C`` draws what an uninterrupted run does.

The pool lives in the checkpoint: every checkpoint of step ``C`` holds the bytes of the snapshots taken up to ``C``
(:func:`saved`, through the ``openmanus_rl_checkpoint_save`` hook), and a run resumed from it puts the folder back
to exactly those (:func:`put_back`): a snapshot missing or altered since is written again, and the snapshots of
steps after ``C`` that a killed attempt left are removed (the resumed run takes them again, at the same steps).

Before the first snapshot the pool's seats are ``self`` seats (every seat the policy, as ``opponent=self``); the
process says so once.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
from pathlib import Path
from typing import Any, Mapping

from openmanus_rl_core.atomic import write_atomic

from openmanus_rl_env_openspiel.exploitability import table_from_rows, table_rows

__all__ = ["POOL", "POOL_GAMES", "PoolOpponent", "check", "check_run", "default_dir", "write_snapshot", "snapshots",
           "choose", "training_step", "load", "saved", "put_back"]

POOL = "pool"

POOL_GAMES = ("kuhn_poker", "leduc_poker")
"""Games a pool seat can play: every information state is scored at a refresh (kuhn_poker 12, leduc_poker 936)."""

_FILE = re.compile(r"^step_(\d+)\.json$")
_STEP = re.compile(r"^(\d+):\d+$")  # the batch rollout's group ids: "<step>:<row>"
_SAID = threading.Event()
_CACHE: dict[Path, tuple[tuple[int, int], dict]] = {}
_CACHE_LOCK = threading.Lock()


def base_game(game_string: str) -> str:
    return game_string.split("(", 1)[0].strip()


def check(game_string: str, pool_size: Any, refresh_steps: Any) -> None:
    """The pool's settings for ``game_string``: ValueError in one line naming the bad value."""
    if base_game(game_string) not in POOL_GAMES:
        raise ValueError(f"opponent=pool: {game_string}: a pool seat plays a stored table of the policy's "
                         f"probabilities at every information state, which only {', '.join(POOL_GAMES)} are small "
                         f"enough to enumerate (use opponent=self)")
    for name, value in (("pool_size", pool_size), ("refresh_steps", refresh_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: must be a positive integer")


def default_dir(run_dir: str | Path) -> Path:
    """Where a training run keeps its pool when ``env.kwargs.pool_dir`` is null: ``<run_dir>/pool``."""
    return Path(run_dir) / "pool"


def check_run(kwargs: Mapping[str, Any], cfg: Any) -> None:
    """The pool's needs of a training run (ValueError naming the key): a snapshot is taken where the driver scores
    the policy, at a validation, so ``refresh_steps`` is a multiple of ``trainer.val_freq``; the batch rollout
    (its group ids carry the step a snapshot is drawn by)."""
    val_freq = cfg.trainer.val_freq
    refresh = kwargs.get("refresh_steps")
    if not val_freq or refresh % val_freq:
        raise ValueError(f"env.kwargs.refresh_steps={refresh}: opponent=pool takes its snapshots at validations, so "
                         f"it must be a multiple of trainer.val_freq ({val_freq})")
    if cfg.rollout.max_staleness is not None:
        raise ValueError(f"rollout.max_staleness={cfg.rollout.max_staleness}: opponent=pool draws its snapshot by "
                         f"the training step, which the group stream's episodes do not have; use null")


def write_snapshot(pool_dir: str | Path, step: int, game_string: str,
                   table: Mapping[tuple[int, str], Mapping[int, float]]) -> Path:
    """``<pool_dir>/step_<step>.json``: the policy's ``pi(a | s)`` at every (player, information state), written
    whole (a temporary file renamed) so a reader never sees half of one."""
    folder = Path(pool_dir)
    folder.mkdir(parents=True, exist_ok=True)
    body = {"game": game_string, "step": int(step), "table": table_rows(table)}
    return write_atomic(folder / f"step_{int(step)}.json", json.dumps(body))


def snapshots(pool_dir: str | Path) -> list[int]:
    """The steps of the snapshots in ``pool_dir``, oldest first."""
    folder = Path(pool_dir)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for m in map(_FILE.match, os.listdir(folder)) if m)


def training_step(group_id: Any) -> int | None:
    """The training step of a batch rollout's group id (``<step>:<row>``), or None (the group stream's ids)."""
    found = _STEP.match(str(group_id or ""))
    return int(found.group(1)) if found else None


def choose(pool_dir: str | Path, step: int, task: int, seat: int, pool_size: int, refresh_steps: int) -> int | None:
    """The snapshot step that plays ``seat`` in task ``task`` at training step ``step``: one of the last
    ``pool_size`` taken before ``step``, drawn by the task, ``step // refresh_steps`` and the seat; None when there
    is none yet."""
    eligible = [s for s in snapshots(pool_dir) if s < step][-pool_size:]
    if not eligible:
        return None
    return random.Random(f"pool:{task}:{step // refresh_steps}:{seat}").choice(eligible)


def load(pool_dir: str | Path, step: int) -> dict[tuple[int, str], dict[int, float]]:
    """Snapshot ``step``'s table (read once per process while the file is unchanged)."""
    path = Path(pool_dir) / f"step_{int(step)}.json"
    info = path.stat()
    mtime = (info.st_mtime_ns, info.st_size)  # a snapshot put back by a resume is a new file: read again
    with _CACHE_LOCK:
        hit = _CACHE.get(path)
        if hit is not None and hit[0] == mtime:
            return hit[1]
    body = json.loads(path.read_text())
    table = table_from_rows(body["table"])
    with _CACHE_LOCK:
        _CACHE[path] = (mtime, table)
    return table


def saved(pool_dir: str | Path, step: int) -> dict[int, bytes]:
    """``{snapshot step: its file's bytes}`` of the snapshots taken up to ``step``: what a checkpoint of ``step``
    keeps of the pool."""
    return {s: (Path(pool_dir) / f"step_{s}.json").read_bytes() for s in snapshots(pool_dir) if s <= step}


def put_back(pool_dir: str | Path, kept: Mapping[int, bytes]) -> tuple[list[int], list[int]]:
    """Make ``pool_dir`` hold exactly the snapshots ``kept`` (a checkpoint's :func:`saved`), byte for byte:
    ``(written, removed)``, the steps of the snapshots written again (missing, or not those bytes) and of those
    removed (not in the checkpoint: a later step's, left by the attempt that was killed)."""
    folder = Path(pool_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for step, body in sorted(kept.items()):
        path = folder / f"step_{int(step)}.json"
        if path.is_file() and path.read_bytes() == body:
            continue
        write_atomic(path, body)
        written.append(int(step))
    removed = [s for s in snapshots(folder) if s not in kept]
    for step in removed:
        (folder / f"step_{step}.json").unlink()
    return written, removed


def say_once(step: int) -> None:
    """Before the first snapshot the pool's seats are self seats: said once per process."""
    if not _SAID.is_set():
        _SAID.set()
        print(f"openspiel: opponent=pool has no snapshot of the policy before step {step} yet: its seats play "
              f"opponent=self until the first refresh", flush=True)


class PoolOpponent:
    """One seat played by snapshot ``snapshot``: its move sampled from the stored ``pi(a | s)`` at the seat's
    information state, with a generator seeded by the task and the seat."""

    def __init__(self, table: Mapping[tuple[int, str], Mapping[int, float]], seed: int, snapshot: int):
        self.table, self.rng, self.snapshot = table, random.Random(seed), snapshot

    def act(self, state: Any) -> int:
        player = state.current_player()
        probs = self.table.get((player, state.information_state_string(player)))
        legal = state.legal_actions(player)
        if not probs:  # a snapshot of another game's variant: never for the snapshots this run writes
            raise RuntimeError(f"openspiel pool: snapshot of step {self.snapshot} has no entry for player {player} "
                               f"at {state.information_state_string(player)!r}")
        weights = [probs.get(a, 0.0) for a in legal]
        return self.rng.choices(legal, weights)[0]
