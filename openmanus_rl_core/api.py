"""The Python API: what the ``openmanus-rl`` commands run, called from Python.

    import openmanus_rl_core as omrl

    def short(trajectory) -> float:               # any fn(trajectory) -> float is a reward component
        return 1.0 / (1 + trajectory.num_turns)

    rewards = {"short": (short, 0.1)}
    metrics = omrl.train(["env=key_door", "trainer.total_steps=20"], rewards=rewards)
    result = omrl.evaluate([f"trainer.checkpoint={metrics['run_dir']}"], rewards=rewards)

:func:`train` runs exactly what ``openmanus-rl train`` runs (the same checks, the same resume rules) and returns the
final metrics; ``rewards`` adds plain Python callables as reward components next to the configured ones (TRL's
``reward_funcs``), logged like any component (``train/reward/<label>/mean``). For a loop of your own, build a
:class:`~openmanus_rl_core.run.trainer.Trainer` from :func:`~openmanus_rl_core.config.loading.load`'s config.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from openmanus_rl_core.rewards.callables import callable_specs


def train(overrides: Sequence[str] | None = None, *, rewards: Mapping[str, Any] | None = None) -> dict:
    """Train as ``openmanus-rl train <overrides>`` does; the final metrics (the last step's, the last validation's),
    with ``run_dir``. ``rewards``: ``{label: fn or (fn, weight)}``, recorded with the run by name; a resume of such
    a run takes them again (:mod:`~openmanus_rl_core.rewards.callables`). Raises
    :class:`~openmanus_rl_core.config.loading.ConfigError` for a bad setting, and ``KeyboardInterrupt`` when a signal stopped
    the run (its checkpoint is saved)."""
    from openmanus_rl_core.cli import prepare
    from openmanus_rl_core.commands.train import run

    specs = callable_specs(rewards)
    typed, kwargs = prepare("train", list(overrides or []), rewards=specs)
    status, final, trainer = run(typed, kwargs.get("changes"), rewards=specs)
    if status:
        run_dir = getattr(trainer, "run_dir", None)  # None: stopped before the run folder was made
        if run_dir is None:
            raise KeyboardInterrupt("training stopped by a signal before the run started; nothing to continue")
        raise KeyboardInterrupt(f"training stopped by a signal; continue with omrl.train("
                                f"['trainer.run_dir={run_dir}', 'trainer.resume=auto'], rewards=...)")
    return {**final, "run_dir": str(trainer.run_dir)}


def evaluate(overrides: Sequence[str] | None = None, *, rewards: Mapping[str, Any] | None = None) -> dict:
    """Score as ``openmanus-rl eval <overrides>`` does; the result (tasks, success_rate, reward_mean, ...).
    ``rewards``: the callables the run was trained with (as given to :func:`train`), scored next to its configured
    components."""
    from openmanus_rl_core.cli import prepare
    from openmanus_rl_core.commands.eval import score

    typed, kwargs = prepare("eval", list(overrides or []))
    return score(typed, rewards=callable_specs(rewards), **kwargs)
