"""The Python API: what the ``openmanus-rl`` commands run, called from Python.

    import openmanus_rl_core as omrl

    def short(trajectory) -> float:               # any fn(trajectory) -> float is a reward component
        return 1.0 / (1 + trajectory.num_turns)

    rewards = {"short": (short, 0.1)}
    metrics = omrl.train(["env=key_door", "trainer.total_steps=20"], rewards=rewards)
    result = omrl.evaluate([f"trainer.checkpoint={metrics['run_dir']}"], rewards=rewards)

    omrl.train(["template=qwen_tools"], env=Thermostat)  # a plain class as the env: its public methods are tools

:func:`train` runs exactly what ``openmanus-rl train`` runs (the same checks, the same resume rules) and returns the
final metrics; ``rewards`` adds plain Python callables as reward components next to the configured ones (TRL's
``reward_funcs``), logged like any component (``train/reward/<label>/mean``); ``env`` takes a plain Python class as
the env (``env=python env.kwargs.cls=<its module>:<its name>``: the run's workers import it by that name, so it must
live at the top level of a module, and a script that defines it keeps its ``train`` call under
``if __name__ == "__main__":``). For a loop of your own, build a
:class:`~openmanus_rl_core.run.trainer.Trainer` from :func:`~openmanus_rl_core.config.loading.load`'s config.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.rewards.callables import callable_specs


def env_class_overrides(env: Any, overrides: Sequence[str]) -> list[str]:
    """``env=Class`` as overrides: ``env=python env.kwargs.cls=<module>:<qualname>`` (a script's class by the script's
    module name, as the run's workers import it). A :class:`ConfigError` for what no worker could import."""
    if not inspect.isclass(env):
        raise ConfigError(f"env={env!r}: must be a class (its public methods are the tools); for a registered env, "
                          "give env=<name> in the overrides")
    if any(o.split("=", 1)[0].lstrip("+~") in ("env", "env.name") for o in overrides):
        raise ConfigError(f"env={env.__qualname__}: the overrides choose an env too; give one or the other")
    qual, module = env.__qualname__, env.__module__
    if "<locals>" in qual:
        raise ConfigError(f"env={qual}: a class defined inside a function cannot be imported by the run's workers; "
                          "define it at the top level of a module")
    if module == "__main__":
        main = sys.modules["__main__"]
        spec, path = getattr(main, "__spec__", None), getattr(main, "__file__", None)
        if spec is not None and spec.name and spec.name != "__main__":  # python -m pkg.mod
            module = spec.name
        elif path:
            module = Path(path).stem
        else:
            raise ConfigError(f"env={qual}: a class defined in an interactive session cannot be imported by the "
                              "run's workers; define it in a .py file")
    return ["env=python", f"env.kwargs.cls={module}:{qual}"]


def train(overrides: Sequence[str] | None = None, *, rewards: Mapping[str, Any] | None = None,
          env: type | None = None) -> dict:
    """Train as ``openmanus-rl train <overrides>`` does; the final metrics (the last step's, the last validation's),
    with ``run_dir``. ``rewards``: ``{label: fn or (fn, weight)}``, recorded with the run by name; a resume of such
    a run takes them again (:mod:`~openmanus_rl_core.rewards.callables`). ``env``: a plain Python class as the env
    (:func:`env_class_overrides`; the ``python`` env plugin). Raises
    :class:`~openmanus_rl_core.config.loading.ConfigError` for a bad setting, and ``KeyboardInterrupt`` when a signal stopped
    the run (its checkpoint is saved)."""
    from openmanus_rl_core.cli import prepare
    from openmanus_rl_core.commands.train import resumable_dir, run

    overrides = list(overrides or [])
    if env is not None:
        overrides += env_class_overrides(env, overrides)
    specs = callable_specs(rewards)
    typed, kwargs = prepare("train", overrides, rewards=specs)
    status, final, trainer = run(typed, kwargs.get("changes"), rewards=specs)
    if status:
        run_dir = resumable_dir(trainer)
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
