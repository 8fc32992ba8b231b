"""Contributes this package's Hydra configs (``env=openspiel``, ``reward=openspiel``); names each trajectory's seat
as its role (self-play: GRPO groups per seat); and, for a run on a game whose tree is small enough to walk
(:data:`~openmanus_rl_env_openspiel.exploitability.TRACTABLE_GAMES`), measures the policy's exploitability and
NashConv at every validation and in ``openmanus-rl eval`` (``val/exploitability``, ``val/nash_conv``), and in
training the exploitability of the run's average policy (``val/exploitability_average``: the mixture of the policies
validated since the warm-up, :mod:`.average`), whose tables every checkpoint keeps; with ``opponent=pool``, keeps the
policy scored at a refresh step's validation as the pool's next snapshot, and the pool's snapshots in every
checkpoint, put back when a run resumes from it (:mod:`.pool`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from openmanus_rl_core.hookspecs import hookimpl

from openmanus_rl_env_openspiel import pool
from openmanus_rl_env_openspiel.average import History


@hookimpl
def openmanus_rl_config_dirs() -> list[str]:
    return [str(Path(__file__).parent / "configs")]


def _plain(node: Any) -> dict:
    if hasattr(node, "_get_node"):  # a DictConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(node, resolve=True)
    return dict(node or {})


_TRAINING: dict[str, int] = {}
"""This process's training run: ``step``, the step being played (set at the run's start and by each rollout), so
a validation knows which step's policy it scored; absent outside training (``eval`` writes no snapshot)."""


@hookimpl
def openmanus_rl_run_start(cfg: Any, run_dir: str) -> None:
    _TRAINING["step"] = 0  # step 0: the untrained policy's validation, then the warm-up's (the last one stays)


_HISTORY = History()
"""This process's training run's validated policies (average.py): put back by a resume before the run starts, and
forgotten when it ends."""


@hookimpl
def openmanus_rl_run_end(run_dir: str, metrics: dict) -> None:
    _TRAINING.clear()  # a later eval in this process writes no snapshot
    _HISTORY.clear()


@hookimpl
def openmanus_rl_policy_metrics(cfg: Any, policy: Any) -> dict[str, float] | None:
    """Exploitability and NashConv of the policy in the run's game (OpenSpiel's own computation), and at a training
    step's validation the exploitability of the run's average policy (average.py); None for another env or a game
    too large to walk."""
    from open_spiel.python.algorithms import exploitability

    from openmanus_rl_env_openspiel.env import OpenSpielEnv
    from openmanus_rl_env_openspiel.exploitability import TRACTABLE_GAMES, as_openspiel, policy_metrics

    if str(cfg.env.name).rsplit(":", 1)[-1] != "openspiel":
        return None
    kwargs = _plain(cfg.env.kwargs)
    env = OpenSpielEnv(**kwargs)
    if env.game_string.split("(", 1)[0].strip() not in TRACTABLE_GAMES:
        return None
    try:
        values, table = policy_metrics(env.game_string, policy.tokenizer, policy.template, env.instruction,
                                       policy.score, with_table=True)
    except LookupError:  # a served model: nothing here scores replies
        return None
    step = _TRAINING.get("step")
    if env.league and env.pool_dir is not None and step is not None and step % env.refresh_steps == 0:  # pool.py
        pool.write_snapshot(env.pool_dir, step, env.game_string, table)
    if env.players != 2:  # exploitability is defined for two-player zero-sum games; NashConv for any
        values.pop("exploitability")
    elif step:  # a validation of a training step: the average of the run's policies so far
        _HISTORY.add(step, table)
        game = env.game
        values["exploitability_average"] = float(exploitability.exploitability(
            game, as_openspiel(game, _HISTORY.average(game))))
    return values


CHECKPOINT_KEY = "openspiel_pool"
"""The pool's entry in a checkpoint's ``plugins`` state: ``{"snapshots": {step: the snapshot file's bytes}}``."""

AVERAGE_KEY = "openspiel_average"
"""The average policy's entry in a checkpoint's ``plugins`` state: ``{"tables": {step: the table as text}}``."""


def _pool_dir(cfg: Any) -> Path | None:
    """The pool's folder of a training run with ``opponent=pool`` (its env kwargs as the env service gave them:
    ``pool_dir`` absolute), else None."""
    if str(cfg.env.name).rsplit(":", 1)[-1] != "openspiel":
        return None
    kwargs = _plain(cfg.env.kwargs)
    if kwargs.get("opponent") != pool.POOL or not kwargs.get("pool_dir"):
        return None
    return Path(kwargs["pool_dir"])


@hookimpl
def openmanus_rl_checkpoint_save(cfg: Any, run_dir: str, step: int) -> dict | None:
    """The pool's snapshots taken up to ``step``, byte for byte, and the average policy's tables up to ``step``, in
    the checkpoint of ``step``."""
    folder = _pool_dir(cfg)
    kept = {} if folder is None else {CHECKPOINT_KEY: {"snapshots": pool.saved(folder, step)}}
    if _HISTORY.tables:
        kept[AVERAGE_KEY] = {"tables": _HISTORY.saved(step)}
    return kept or None


@hookimpl
def openmanus_rl_checkpoint_restore(cfg: Any, run_dir: str, step: int, state: dict) -> None:
    """The pool's folder made to hold exactly the checkpoint's snapshots (a resumed run draws what an uninterrupted
    one does); a checkpoint without them (of a run that had no pool) leaves the folder as it is. The average
    policy's tables become exactly the checkpoint's."""
    if AVERAGE_KEY in state:
        _HISTORY.put_back(state[AVERAGE_KEY]["tables"])
    folder = _pool_dir(cfg)
    if folder is None or CHECKPOINT_KEY not in state:
        return
    written, removed = pool.put_back(folder, state[CHECKPOINT_KEY]["snapshots"])
    if written or removed:
        print(f"openspiel: the pool in {folder} put back to the checkpoint of step {step}: snapshots "
              f"{written or 'none'} written again, {removed or 'none'} (after the checkpoint) removed", flush=True)


HEADER = re.compile(r"\AGame: (.+)\. You are player (\d+) of \d+\.$", re.MULTILINE)
"""The first line of every observation this env gives a seat (:func:`~openmanus_rl_env_openspiel.games.describe`)."""


@hookimpl
def openmanus_rl_process_trajectories(trajectories: list, step: int) -> None:
    """Each openspiel trajectory's seat as ``info["role"]`` (``<game>:seat<k>``, the ``rae`` estimator's baseline
    key), read from its first observation, so an episode cut before its first step has it too; its group becomes
    ``<group>|<role>``, so group estimators (GRPO) compare a seat's games with the same seat's alone (against fixed
    opponents the samples of a group play one seat already: the label changes nothing there)."""
    if "step" in _TRAINING:
        _TRAINING["step"] = int(step)
    for traj in trajectories:
        found = HEADER.match(traj.initial_observation or "")
        if found is None:
            continue
        role = f"{found.group(1)}:seat{found.group(2)}"
        traj.info["role"] = role
        if not str(traj.group_id).endswith(f"|{role}"):
            traj.group_id = f"{traj.group_id}|{role}"
