"""Hook module: puts this package's ``configs/`` (``env/dataset.yaml``) on the Hydra search path, and fills a
missing ground truth from the dataset env's step info.

Task files that ``openmanus-rl data make`` / the trainer write for ``env=dataset`` already carry each row's
``ground_truth`` (through :meth:`DatasetEnv.task_fields`). Hand-written task files may hold only ``task_id`` and
``seed``; for those, the ground truth the env reported in the last turn's ``info`` is copied into
``trajectory.task`` before the rewards are composed, so scorers still find it. A ground truth already in the task
is never replaced.
"""

from __future__ import annotations

from pathlib import Path

from openmanus_rl_core.hookspecs import hookimpl


@hookimpl
def openmanus_rl_config_dirs() -> list[str]:
    return [str(Path(__file__).parent / "configs")]


@hookimpl
def openmanus_rl_process_trajectories(trajectories: list, step: int) -> None:
    for traj in trajectories:
        if not getattr(traj, "turns", None):
            continue
        info = traj.turns[-1].info or {}
        # Only the dataset env's own step info: it carries the row index next to the ground truth.
        if "row" not in info or info.get("ground_truth") is None:
            continue
        task = traj.task if isinstance(traj.task, dict) else {}
        rm = task.get("reward_model")
        if task.get("ground_truth") is None and not (isinstance(rm, dict) and rm.get("ground_truth") is not None):
            task["ground_truth"] = info["ground_truth"]
            if task.get("data_source") is None and info.get("data_source") is not None:
                task["data_source"] = info["data_source"]
            traj.task = task
