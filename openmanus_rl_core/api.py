"""The Python API: what the ``openmanus-rl`` commands run, called from Python.

    import openmanus_rl_core as omrl

    def short(trajectory) -> float:               # any fn(trajectory) -> float is a reward component
        return 1.0 / (1 + trajectory.num_turns)

    metrics = omrl.train(["env=key_door", "trainer.total_steps=20"], rewards={"short": (short, 0.1)})
    result = omrl.evaluate([f"trainer.checkpoint={metrics['run_dir']}"])

:func:`train` runs exactly what ``openmanus-rl train`` runs (the same checks, the same resume rules) and returns the
final metrics; ``rewards`` adds plain Python callables as reward components next to the configured ones (TRL's
``reward_funcs``), logged like any component (``train/reward/<label>/mean``). For a loop of your own, build a
:class:`~openmanus_rl_core.trainer.Trainer` from :func:`~openmanus_rl_core.config.load`'s config.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from openmanus_rl_core.config import ConfigError


class CallableReward:
    """A plain ``fn(trajectory) -> float`` (or a dict with ``score``) as a reward component."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def compute(self, trajectory: Any) -> Any:
        return self.fn(trajectory)


def reward_specs(rewards: Mapping[str, Any] | None) -> list:
    """``{label: fn or (fn, weight)}`` as the composer's component specs."""
    from openmanus_rl_core.rewards import ComponentSpec

    specs = []
    for label, value in (rewards or {}).items():
        fn, weight = value if isinstance(value, tuple) else (value, 1.0)
        if not callable(fn):
            raise ConfigError(f"rewards[{label!r}]={fn!r}: must be a callable fn(trajectory) -> float, or (fn, weight)")
        name = f"python:{getattr(fn, '__qualname__', type(fn).__name__)}"
        specs.append(ComponentSpec(str(label), name, weight, CallableReward(fn)))
    return specs


def train(overrides: Sequence[str] | None = None, *, rewards: Mapping[str, Any] | None = None) -> dict:
    """Train as ``openmanus-rl train <overrides>`` does; the final metrics (the last step's, the last validation's),
    with ``run_dir``. Raises :class:`~openmanus_rl_core.config.ConfigError` for a bad setting, and
    ``KeyboardInterrupt`` when a signal stopped the run (its checkpoint is saved)."""
    from openmanus_rl_core.cli import prepare
    from openmanus_rl_core.commands.train import run

    typed, kwargs = prepare("train", list(overrides or []))
    specs = reward_specs(rewards)
    status, final, trainer = run(typed, kwargs.get("changes"), rewards=specs)
    if status:
        raise KeyboardInterrupt(f"training stopped by a signal; its checkpoint is in {trainer.run_dir}")
    return {**final, "run_dir": str(trainer.run_dir)}


def evaluate(overrides: Sequence[str] | None = None) -> dict:
    """Score as ``openmanus-rl eval <overrides>`` does; the result (tasks, success_rate, reward_mean, ...)."""
    from openmanus_rl_core.cli import prepare
    from openmanus_rl_core.commands.eval import score

    typed, kwargs = prepare("eval", list(overrides or []))
    return score(typed, **kwargs)
