"""Lifecycle hooks a plugin module (entry-point group ``openmanus_rl``) may implement.

Implement any subset in a module and register it::

    [project.entry-points.openmanus_rl]
    my_plugin = "my_package.hooks"

    # my_package/hooks.py
    from openmanus_rl_core.hookspecs import hookimpl

    @hookimpl
    def openmanus_rl_step_end(step, metrics):
        print(step, metrics["train/reward_mean"])
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "openmanus_rl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def openmanus_rl_config_dirs() -> list[str]:
    """Config folders this plugin contributes to the Hydra search path.

    Return paths or Hydra search-path URLs (``pkg://my_package.configs``, ``file:///abs/dir``). A folder
    holds group options such as ``env/my_env.yaml`` so that ``openmanus-rl train env=my_env`` works
    right after ``pip install``. Every implementation's list is used.
    """


@hookspec
def openmanus_rl_run_start(cfg: Any, run_dir: str) -> None:
    """Called once before the first step with the composed config (an OmegaConf DictConfig) and the
    run directory, e.g. to open a logger."""


@hookspec
def openmanus_rl_process_trajectories(trajectories: list, step: int) -> None:
    """Called after each rollout, before rewards are composed, with the step's
    :class:`~openmanus_rl_core.protocols.Trajectory` list. May change the trajectories in place
    (filter turns, add ``info``); must keep the list's length and order."""


@hookspec
def openmanus_rl_rollout_end(trajectories: list, metrics: dict[str, float], step: int) -> None:
    """Called after rewards are composed, with the trajectories and the rollout's metrics (read only)."""


@hookspec
def openmanus_rl_step_end(step: int, metrics: dict[str, float]) -> None:
    """Called after each training step with that step's metrics (``train/reward_mean`` and others)."""


@hookspec
def openmanus_rl_policy_metrics(cfg: Any, policy: Any) -> dict[str, float] | None:
    """Metrics of the policy itself, beyond its episodes' rewards (e.g. a game policy's exploitability).

    Called at every validation during training (each value logged as ``val/<name>``) and by ``openmanus-rl eval``
    (printed, and in its JSON), with the composed config (typed) and a
    :class:`~openmanus_rl_core.models.scoring.PolicyScorer`: ``policy.tokenizer``, ``policy.template`` and
    ``policy.score(prompts, continuations) -> list[float]``, the summed log-probability of each continuation's
    token ids after its prompt's under the policy being validated. Return ``{name: value}``, or None when the run
    is not one this plugin measures. ``score`` raises ``LookupError`` when the rollout engine holds no model in
    the process (a served model)."""


@hookspec
def openmanus_rl_checkpoint_save(cfg: Any, run_dir: str, step: int) -> dict[str, Any] | None:
    """State this plugin keeps in every training checkpoint, so that a run resumed from it (or sent back to it after
    a worker failure) finds that state as it was at ``step``: e.g. files the plugin wrote during training.

    Called on the driver as the checkpoint of ``step`` is written, with the run's typed config and its folder.
    Return ``{key: value}`` with a key naming this plugin (two plugins returning one key is an error), values a
    checkpoint can hold (tensors, dicts, lists, numbers, strings, bytes), or None. Every plugin's entries are saved
    together as the checkpoint's ``plugins`` entry, checked like the rest of it on load."""


@hookspec
def openmanus_rl_checkpoint_restore(cfg: Any, run_dir: str, step: int, state: dict[str, Any]) -> None:
    """Put back what :func:`openmanus_rl_checkpoint_save` kept: called on the driver when a run resumes from the
    checkpoint of ``step`` (and when it goes back to one after a worker failure), before its next step is played,
    with every plugin's entries as saved (``{}`` for a checkpoint that holds none). ``run_dir`` is the resuming run's
    folder, which need not be the one the checkpoint was written in."""


@hookspec
def openmanus_rl_run_end(run_dir: str, metrics: dict[str, float]) -> None:
    """Called once after the last step with the final metrics, also when the run failed part way."""
