"""Env services: what an env needs running before its first episode (servers), owned by the driver process.

An env entry point (class or factory in the ``openmanus_rl.envs`` group) may have a ``serve(**kwargs)`` method
returning an :class:`EnvService`. The driver of a command (``train``, ``rollout``, ``data verify``) calls
:func:`open_env_service` once, before any model or tokenizer is built: the service checks that the env's servers
answer (or starts them, and is then their only owner: the one process that restarts them), and hands back the
keyword arguments every env is then built with, in this process and in every worker. Those arguments reach the
servers by URL; they never start one. Envs without ``serve`` run in-process and keep their kwargs unchanged.

A ``serve`` that declares an ``at_once`` parameter is also told the most episodes the command plays at once (one
env each), to size its servers: for ``train`` the larger of a step's and a validation's
(:func:`openmanus_rl_core.run.setup.train_at_once`),
for ``rollout`` its tasks times ``rollout.n`` (at most ``rollout.batch_size``), for ``eval`` its tasks, for
``data verify`` 1. One that declares a ``run_dir`` parameter is told the training run's folder (None for the other
commands), for files the env keeps with the run (they go into its checkpoints through the
``openmanus_rl_checkpoint_save`` hook).

:class:`EnvUnavailableError` is the one error for "this env cannot be used at all" (its server is down, or every
episode of several steps failed on it); the command line prints its message on one line and exits with status 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["EnvService", "EnvUnavailableError", "EnvErrorWatch", "open_env_service", "undelayed"]


class EnvUnavailableError(RuntimeError):
    """The env cannot be used: its server does not answer or cannot be started, or every episode failed."""


@dataclass
class EnvService:
    """What :func:`open_env_service` returns: the kwargs envs are built with, and how to stop what it started.

    ``kwargs``: keyword arguments for the env's factory, in the driver and in every worker.
    ``stop``: stops the servers the service started (nothing for servers it only checked); idempotent.
    ``check``: waits until the servers answer again (a restart in progress) or raises :class:`EnvUnavailableError`
    naming the ones that do not; None for envs with nothing to check.
    """

    kwargs: dict[str, Any]
    stop: Callable[[], None] = field(default=lambda: None)
    check: Callable[[], None] | None = None

    def close(self) -> None:
        self.stop()


def open_env_service(name: str, factory: Any, kwargs: Mapping[str, Any], at_once: int | None = None,
                     run_dir: Any = None) -> EnvService:
    """``factory.serve(**kwargs)`` when the env has one (it raises :class:`EnvUnavailableError` when the env's
    servers cannot be reached or started), else the kwargs unchanged. ``name`` labels messages; ``at_once``: the
    most episodes the command plays at once, and ``run_dir``: the training run's folder, each given to a ``serve``
    that declares a parameter of that name."""
    import inspect

    serve = getattr(factory, "serve", None)
    if not callable(serve):
        return EnvService(dict(kwargs))
    declared = inspect.signature(serve).parameters
    told = {"at_once": None if at_once is None else int(at_once), "run_dir": None if run_dir is None else str(run_dir)}
    service = serve(**dict(kwargs), **{k: v for k, v in told.items() if v is not None and k in declared})
    if not isinstance(service, EnvService):
        raise TypeError(f"env {name!r}: serve() returned {type(service).__name__}, not an EnvService")
    return service


def undelayed(env_factory: Callable[[], Any]) -> Callable[[], Any]:
    """``env_factory`` for work off the rollout path (the tokenizer corpus, the warm-up's oracle episodes): an env
    with ``without_delays()`` (see :class:`~openmanus_rl_core.protocols.Env`) is replaced by the env it returns, so
    those episodes do not sit through a wrapper's simulated waits."""
    def make() -> Any:
        env = env_factory()
        without = getattr(env, "without_delays", None)
        return without() if callable(without) else env

    return make


class EnvErrorWatch:
    """Counts consecutive steps on which every episode ended as ``env_error``; raises after ``limit`` of them.

    ``limit`` 0 turns the watch off. :meth:`update` takes the step's terminations (one per episode). With a
    ``check`` (:attr:`EnvService.check`), the first time the streak reaches the limit the watch asks it first: a
    server that was being restarted and answers again gives the run another ``limit`` steps (a check that fails
    aborts at once); a second streak without a working step in between aborts.
    """

    def __init__(self, limit: int, check: Callable[[], None] | None = None):
        if int(limit) < 0:
            raise ValueError(f"trainer.max_env_error_steps must be >= 0 (0: never abort), got {limit}")
        self.limit = int(limit)
        self.check = check
        self.streak = 0
        self.rechecked = False

    def update(self, step: int, terminations: list[str], errors: list[str | None]) -> None:
        failed = bool(terminations) and all(t == "env_error" for t in terminations)
        self.streak = self.streak + 1 if failed else 0
        self.rechecked = self.rechecked and failed
        if self.limit and self.streak >= self.limit and self.check is not None and not self.rechecked:
            self.check()  # raises when the servers are gone for good
            self.streak, self.rechecked = 0, True
            return
        if self.limit and self.streak >= self.limit:
            first = next((e for e in errors if e), "no message")
            raise EnvUnavailableError(
                f"every episode of the last {self.streak} steps (up to step {step}) ended as env_error, so nothing "
                f"trains; the first error: {first}. Check the env's server (trainer.max_env_error_steps="
                f"{self.limit}; 0 never aborts)")
