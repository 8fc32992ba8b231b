"""What ``env.kwargs`` names, resolved with verifiers' own loaders: the environment id, its config, its rows.

verifiers (0.4, v1 API) imports it lazily: listing the plugins, or a run of another env, does not import it.

- :func:`check` refuses an id that is not a verifiers environment, and taskset settings verifiers rejects, in one
  line (``id=...: ...``), for the config check (``VerifiersEnv.Kwargs``).
- :func:`env_config` is the environment's config: the taskset with its settings, every seat played by the
  in-process harness (``omrl_verifiers_harness``) in the ``subprocess`` runtime, so nothing needs the network.
- :func:`rows` is the taskset's tasks, loaded once per process (``task_id`` indexes them).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
from typing import Any, Mapping

HARNESS_ID = "omrl_verifiers_harness"  # the top-level module omrl_verifiers_harness.py
RUNTIME = {"type": "subprocess"}  # the only runtime that runs here; the harness launches no program in it

__all__ = ["HARNESS_ID", "check", "env_config", "rows", "settings_key"]


def module_name(env_id: str) -> str:
    """The module verifiers imports for ``env_id`` (``owner/name@version`` -> ``name``, ``-`` -> ``_``)."""
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def settings_key(taskset: Mapping[str, Any] | None, max_tasks: int | None) -> str:
    """The settings besides the id as one JSON text: the cache key, and the task rows' ``verifiers_settings``."""
    return json.dumps({"taskset": dict(taskset or {}), "max_tasks": max_tasks}, sort_keys=True, default=str)


def check(env_id: Any, taskset: Mapping[str, Any] | None = None, max_tasks: int | None = None) -> None:
    """Raise ``ValueError("id=<id>: ...")`` (one line) unless ``env_id`` is an installed verifiers environment
    whose config takes ``taskset``'s settings."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"id={'null' if env_id is None else env_id}: required: the verifiers environment to train, "
                         f"a module name or an owner/name@version id (env.kwargs.id=...)")
    _taskset_class(env_id)
    if max_tasks is not None and max_tasks < 1:
        raise ValueError(f"max_tasks={max_tasks}: must be >= 1 or null")
    env_config(env_id, settings_key(taskset, max_tasks))


def _taskset_class(env_id: str) -> type:
    """The id's ``Taskset`` subclass, as verifiers finds it; a one-line ``ValueError`` when there is none."""
    module = module_name(env_id)
    where = f"id={env_id}"
    try:
        spec_found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:  # a dotted name whose parent package does not import, a bad name
        raise ValueError(f"{where}: not a verifiers environment: the module {module!r} cannot be imported "
                         f"({type(exc).__name__}: {_first_line(exc)}); give a module name or owner/name@version"
                         ) from None
    builtin = _builtin(module)
    if spec_found is None and not builtin:
        raise ValueError(f"{where}: not a verifiers environment: no module {module!r} is installed; install the "
                         f"environment (or put its module on PYTHONPATH)")
    try:
        from verifiers.v1.utils.loaders import taskset_class

        return taskset_class(env_id)
    except KeyboardInterrupt:
        raise
    except (TypeError, AttributeError) as exc:  # no Taskset subclass in __all__, or no __all__
        raise ValueError(f"{where}: not a verifiers environment: {_first_line(exc)}") from None
    except BaseException as exc:  # the module's own import may fail in any way
        raise ValueError(f"{where}: the verifiers environment {module!r} cannot be imported: "
                         f"{type(exc).__name__}: {_first_line(exc)}") from None


def _builtin(module: str) -> bool:
    try:
        return importlib.util.find_spec(f"verifiers.v1.tasksets.{module}") is not None
    except (ImportError, ValueError):
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@functools.lru_cache(maxsize=16)
def env_config(env_id: str, settings: str) -> Any:
    """The verifiers ``EnvConfig`` of ``env_id`` with ``settings`` (:func:`settings_key`): the taskset's settings,
    and each seat (every ``AgentConfig`` field of the env's config) played by the in-process harness."""
    import verifiers.v1 as vf
    from pydantic import ValidationError

    taskset = json.loads(settings)["taskset"]
    cls = vf.env_config_type(env_id)
    seats = [name for name, f in cls.model_fields.items() if isinstance(f.default, vf.AgentConfig)]
    data = {"taskset": {**taskset, "id": env_id},
            **{seat: {"harness": {"id": HARNESS_ID}, "runtime": dict(RUNTIME)} for seat in seats}}
    try:
        return vf.resolve_env_config(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        msg = str(err.get("msg", exc)).splitlines()[0]
        if loc[:1] == ["taskset"] and len(loc) > 1 and err.get("type") == "missing":
            raise ValueError(f"taskset.{'.'.join(loc[1:])}: required by the taskset {env_id}; set "
                             f"env.kwargs.taskset.{'.'.join(loc[1:])}=...") from None
        if loc[:1] == ["taskset"] and len(loc) > 1:  # one of the settings given in env.kwargs.taskset
            value = err.get("input")
            shown = "null" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else value
            raise ValueError(f"taskset.{'.'.join(loc[1:])}={shown}: the taskset {env_id} refuses it: {msg}") from None
        raise ValueError(f"id={env_id}: its verifiers config refuses {'.'.join(loc) or 'its settings'}: "
                         f"{msg}") from None


@functools.lru_cache(maxsize=16)
def rows(env_id: str, settings: str) -> tuple:
    """The taskset's tasks, in ``load()`` order (at most ``max_tasks``); loaded once per process."""
    import itertools

    import verifiers.v1 as vf

    max_tasks = json.loads(settings)["max_tasks"]
    taskset = vf.load_taskset(env_config(env_id, settings).taskset)
    if max_tasks is None and not taskset.bounded:
        raise ValueError(f"env.kwargs.id={env_id}: the taskset yields tasks forever; set env.kwargs.max_tasks")
    tasks = tuple(itertools.islice(iter(taskset), max_tasks))
    if not tasks:
        raise ValueError(f"env.kwargs.id={env_id}: the taskset has no tasks")
    return tasks
