"""Contributes this package's Hydra configs: ``env=textarena`` and ``reward=textarena``; and names each self-play
trajectory's seat as its role (GRPO groups per seat)."""

from __future__ import annotations

from pathlib import Path

from openmanus_rl_core.hookspecs import hookimpl


@hookimpl
def openmanus_rl_config_dirs() -> list[str]:
    return [str(Path(__file__).parent / "configs")]


@hookimpl
def openmanus_rl_process_trajectories(trajectories: list, step: int) -> None:
    """Each self-play trajectory's seat (its steps' ``info["role"]``, ``<game>:seat<k>``) as ``info["role"]`` (the
    ``rae`` estimator's baseline key), and its group ``<group>|<role>``, so GRPO compares a seat's games with the
    same seat's alone (one seat may be favoured: the first mover in TicTacToe)."""
    for traj in trajectories:
        role = next((t.info.get("role") for t in traj.turns if isinstance(t.info, dict) and t.info.get("role")), None)
        if role is None or ":seat" not in str(role):  # fixed opponents: one seat a group already
            continue
        traj.info["role"] = role
        if not str(traj.group_id).endswith(f"|{role}"):
            traj.group_id = f"{traj.group_id}|{role}"
