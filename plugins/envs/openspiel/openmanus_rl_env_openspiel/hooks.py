"""Contributes this package's Hydra configs (``env=openspiel``, ``reward=openspiel``); names each trajectory's seat
as its role (self-play: GRPO groups per seat); and, for a run on a game whose tree is small enough to walk
(:data:`~openmanus_rl_env_openspiel.exploitability.TRACTABLE_GAMES`), measures the policy's exploitability and
NashConv at every validation and in ``openmanus-rl eval`` (``val/exploitability``, ``val/nash_conv``); with
``opponent=pool``, keeps the policy scored at a refresh step's validation as the pool's next snapshot (:mod:`.pool`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from openmanus_rl_core.hookspecs import hookimpl

from openmanus_rl_env_openspiel import pool


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


@hookimpl
def openmanus_rl_run_end(run_dir: str, metrics: dict) -> None:
    _TRAINING.clear()  # a later eval in this process writes no snapshot


@hookimpl
def openmanus_rl_policy_metrics(cfg: Any, policy: Any) -> dict[str, float] | None:
    """Exploitability and NashConv of the policy in the run's game (OpenSpiel's own computation), or None for
    another env or a game too large to walk."""
    from openmanus_rl_env_openspiel.env import OpenSpielEnv
    from openmanus_rl_env_openspiel.exploitability import TRACTABLE_GAMES, policy_metrics

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
    if env.league and step is not None and step % env.refresh_steps == 0:  # the pool's next member (pool.py)
        pool.write_snapshot(env.pool_dir, step, env.game_string, table)
    if env.players != 2:  # exploitability is defined for two-player zero-sum games; NashConv for any
        values.pop("exploitability")
    return values


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
