"""``python``: a plain Python class as an env; its public methods are the tools.

``env.kwargs.cls=pkg.mod:Class`` (or ``omrl.train(..., env=Class)``, which sets it). The class contract:

- ``reset(**task) -> str``: starts an episode and returns the first observation (``None`` counts as ``""``).
- every public method (a name without a leading ``_``, other than ``reset``, ``get_reward`` and ``close``) is a
  tool: its signature (type hints) and docstring make its OpenAI function schema (:mod:`.schema`); what it returns
  is the observation (a ``str`` as it is, anything else as JSON). A tool may raise to refuse a call: the model sees
  the error as the observation.
- ``get_reward() -> float`` (optional): the env's reward, read after every call; each step's reward is its change,
  so an episode's env rewards sum to ``get_reward()`` after its last call, however it ended. Each step's
  ``info["score"]`` is the value itself (``reward=python`` trains on it).
- ``self.done = True`` (optional, set by a tool) ends the episode; ``self.success`` (optional bool) is reported as
  ``info["success"]``.
- ``close()`` (optional): called once when the episode's env is closed.

One instance per episode: ``reset`` builds ``Class(**init)`` afresh, then calls its ``reset``.

**Where a task's kwargs come from** (task id ``t``, seed ``s`` of a task row): ``env.kwargs.tasks`` (a list of
mappings), else the class's own ``tasks`` attribute: ``reset(**tasks[t])`` (``num_tasks`` is their count, so
generated ids wrap around it; ``t=None`` picks one with seed ``s``). Without a list: ``reset(task_id=t, seed=s)``,
each only where ``reset`` takes it (by name, or ``**kwargs``), so a class that draws its own task from the seed needs
nothing more. **A task file's own columns** (``data.train_files``: a dataset with, say, ``question`` and ``answer``
columns, as TRL's environments read theirs) go to ``reset`` too, over the kwargs above: each column ``reset`` names,
and with ``**kwargs`` every column but the core's bookkeeping (:data:`BOOKKEEPING`); a null is left out.

**A step**: ``Env.step`` receives the canonical call text ``{"name": ..., "arguments": {...}}`` that the tool-calling
templates (``qwen_tools``, ``llama3_tools``, ``hermes_tools``) write. Anything else (a reply that is not a call, an
unknown tool, a missing, unknown or ill-typed argument, a tool that raised) is an invalid action
(``info["invalid"] = True``) whose observation says why; the class's state is unchanged except by a tool that raised.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from openmanus_rl_core.protocols import StepResult, as_text

from openmanus_rl_env_python.schema import SchemaError, check_value, function_schema

__all__ = ["PythonEnv", "ClassSpec", "load_class", "class_spec", "RESERVED"]

RESERVED = ("reset", "get_reward", "close")
# Task-row columns the core keeps for itself: a ``reset(**kwargs)`` is not given them (one that names them is).
BOOKKEEPING = frozenset({"env", "task_id", "seed", "split", "data_source", "source", "extra", "group_id",
                         "sample_index", "demonstration", "observation", "uid", "index"})
"""Public names that are part of the contract, not tools."""


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def load_class(ref: Any) -> type:
    """The class ``ref`` (``pkg.mod:Class``, or ``pkg.mod.Class``) names; a ``ValueError`` saying why not, in one line
    starting ``cls=<ref>:``. A module in the current folder is found too, as ``python -m`` would."""
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(f"cls={_show(ref)}: required: the class whose public methods are the tools, as "
                         "env.kwargs.cls=pkg.mod:Class")
    module, sep, attr = ref.partition(":")
    if not sep:
        module, _, attr = ref.rpartition(".")
    if not module or not attr:
        raise ValueError(f"cls={ref}: must name a class as pkg.mod:Class")
    try:
        mod = _import(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise ValueError(f"cls={ref}: no module named {exc.name!r} (install it, or run from the folder that holds "
                             f"it, or put that folder on PYTHONPATH)") from None
        raise ValueError(f"cls={ref}: importing {module} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001  (the user's module: anything may fail while it is imported)
        raise ValueError(f"cls={ref}: importing {module} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"cls={ref}: the module {module} has no {attr!r}")
    if not inspect.isclass(obj):
        raise ValueError(f"cls={ref}: {attr} is a {type(obj).__name__}, not a class")
    return obj


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if here in sys.path or "" in sys.path or not exc.name or not module.startswith(exc.name):
            raise
        sys.path.append(here)  # a console script's path lacks the current folder (Ray's workers have it)
        try:
            return importlib.import_module(module)
        finally:
            sys.path.remove(here)


@dataclass
class ClassSpec:
    """What env=python reads off a class once: its tools and how its ``reset`` is called."""

    cls: type
    schemas: list[dict[str, Any]]
    params: dict[str, dict[str, Any]]  # tool name -> its "parameters" schema
    reset_names: frozenset[str]
    reset_open: bool  # reset takes **kwargs
    has_reward: bool

    @property
    def listing(self) -> str:
        """The tools as ``name(arg, ...)``, for messages."""
        return ", ".join(f"{n}({', '.join(p.get('properties', {}))})" for n, p in self.params.items())


def _methods(cls: type) -> dict[str, tuple[Callable[..., Any], bool]]:
    """Public functions of the class and its bases, in definition order: name -> (function, takes self)."""
    found: dict[str, tuple[Callable[..., Any], bool]] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, attr in vars(klass).items():
            if name.startswith("_") or name in RESERVED:
                continue
            if isinstance(attr, staticmethod):
                found[name] = (attr.__func__, False)
            elif isinstance(attr, classmethod) or inspect.isfunction(attr):
                found[name] = (getattr(attr, "__func__", attr), True)
            else:
                found.pop(name, None)  # a subclass made it an attribute
    return found


@functools.lru_cache(maxsize=64)
def class_spec(cls: type) -> ClassSpec:
    """The class's tools and ``reset`` (a ``ValueError`` naming the class when it breaks the contract)."""
    name = cls.__qualname__
    reset = getattr(cls, "reset", None)
    if not callable(reset):
        raise ValueError(f"the class {name} has no reset(**task) method; env=python starts each episode with it "
                         "(it returns the first observation)")
    schemas, params = [], {}
    for tool, (fn, bound) in _methods(cls).items():
        try:
            schema = function_schema(tool, fn, bound=bound)
        except (SchemaError, ValueError, TypeError) as exc:
            raise ValueError(f"the tool {name}.{exc}") from None
        schemas.append(schema)
        params[tool] = schema["function"]["parameters"]
    if not schemas:
        raise ValueError(f"the class {name} has no public method, so the model has no tool to call")
    sig = inspect.signature(reset)
    kinds = [p.kind for p in sig.parameters.values()]
    return ClassSpec(cls, schemas, params, frozenset(sig.parameters), inspect.Parameter.VAR_KEYWORD in kinds,
                     callable(getattr(cls, "get_reward", None)))


def _bind_check(fn: Callable[..., Any], kwargs: dict[str, Any], what: str, bound: bool = True) -> None:
    try:
        sig = inspect.signature(fn)
        if bound:
            sig = sig.replace(parameters=list(sig.parameters.values())[1:])
        sig.bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{what}: {exc}") from None
    except ValueError:  # no signature to read: building it tells
        pass


class PythonEnv:
    """A plain Python class as an env (module docstring).

    kwargs: ``cls`` (``pkg.mod:Class``), ``init`` (the class's constructor arguments), ``tasks`` (a list of
    ``reset`` kwargs, one per task id), ``instruction`` (the task description templates put in the system prompt;
    null: the class's docstring).
    """

    @dataclass
    class Kwargs:
        """``env.kwargs``, checked before the run starts: the class imports and keeps the contract, ``init`` fits
        its constructor, each task fits its ``reset``."""

        cls: Optional[str] = None
        init: Dict[str, Any] = field(default_factory=dict)
        tasks: Optional[List[Dict[str, Any]]] = None
        instruction: Optional[str] = None

        def __post_init__(self) -> None:
            klass = load_class(self.cls)
            try:
                spec = class_spec(klass)
            except ValueError as exc:
                raise ValueError(f"cls={self.cls}: {exc}") from None
            _bind_check(klass, dict(self.init or {}), f"init={json.dumps(self.init)}: {klass.__qualname__}(...)",
                        bound=False)
            if self.tasks is not None:
                if not self.tasks:
                    raise ValueError("tasks=[]: give at least one task (a mapping of reset's kwargs), or null")
                for i, task in enumerate(self.tasks):
                    if not isinstance(task, dict):
                        raise ValueError(f"tasks[{i}]={task!r}: must be a mapping of {klass.__qualname__}.reset's "
                                         "kwargs")
                    _bind_check(spec.cls.reset, task, f"tasks[{i}]={json.dumps(task, default=str)}: "
                                f"{klass.__qualname__}.reset(...)")

    def __init__(self, **kwargs: Any):
        k = self.Kwargs(**kwargs)
        self.spec = class_spec(load_class(k.cls))
        self.tools = [json.loads(json.dumps(s)) for s in self.spec.schemas]  # the caller's own copy
        doc = inspect.getdoc(self.spec.cls) if self.spec.cls.__doc__ else ""
        self.instruction = (doc or "") if k.instruction is None else str(k.instruction)
        self._init = dict(k.init or {})
        tasks = k.tasks if k.tasks is not None else getattr(self.spec.cls, "tasks", None)
        self._tasks = [dict(t) for t in tasks] if tasks is not None else None
        if self._tasks is not None:
            self.num_tasks = len(self._tasks)
        elif isinstance(getattr(self.spec.cls, "num_tasks", None), int):
            self.num_tasks = int(self.spec.cls.num_tasks)
        self._obj: Any = None
        self._score = 0.0
        self._done = True

    # ----------------------------------------------------------------------------------- protocol
    def _task(self, task_id: Any, seed: Any) -> dict[str, Any]:
        if self._tasks is None:
            given = {"task_id": task_id, "seed": seed}
            return {k: v for k, v in given.items() if self.spec.reset_open or k in self.spec.reset_names}
        n = len(self._tasks)
        if task_id is None:
            return dict(self._tasks[random.Random(seed).randrange(n)])
        if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 <= task_id < n:
            raise ValueError(f"python env: task_id {task_id!r} is out of range: {self.spec.cls.__qualname__} has "
                             f"{n} tasks (ids 0..{n - 1})")
        return dict(self._tasks[task_id])

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """A fresh instance, started with the task's kwargs (module docstring); its first observation."""
        return self._start(self._task(task_id, seed))

    def start_task(self, task: dict[str, Any]) -> str:
        """Start a task row: :meth:`reset`'s kwargs, with the row's own columns that ``reset`` takes over them."""
        kwargs = self._task(task.get("task_id"), task.get("seed"))
        for column, value in task.items():
            named = column in self.spec.reset_names and column not in ("task_id", "seed")
            if value is not None and (named or (self.spec.reset_open and column not in BOOKKEEPING)):
                kwargs[column] = value
        return self._start(kwargs)

    def _start(self, task: dict[str, Any]) -> str:
        self._close_instance()
        self._obj = self.spec.cls(**self._init)
        first = self._obj.reset(**task)
        self._score, self._done = 0.0, False
        return "" if first is None else as_text(first)

    def step(self, action: str) -> StepResult:
        """Run one call (module docstring)."""
        if self._obj is None:
            raise RuntimeError("python env: call reset() before step()")
        if self._done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True})
        call, why = self._read(as_text(action))
        if call is None:
            return self._invalid(why)
        name, args = call
        try:
            result = getattr(self._obj, name)(**args)
        except Exception as exc:  # noqa: BLE001  (a tool refusing its arguments, or failing: the model sees why)
            return self._invalid(f"{name} failed: {type(exc).__name__}: {exc}", tool_error=True)
        observation = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        info: dict[str, Any] = {"tool": name}
        reward = 0.0
        if self.spec.has_reward:
            score = float(self._obj.get_reward())
            if not math.isfinite(score):
                raise ValueError(f"{self.spec.cls.__qualname__}.get_reward() returned {score}, not a finite number")
            reward, self._score = score - self._score, score
            info["score"] = score
        success = getattr(self._obj, "success", None)
        if isinstance(success, bool):
            info["success"] = success
        self._done = bool(getattr(self._obj, "done", False))
        return StepResult(observation, reward, self._done, info)

    def close(self) -> None:
        self._done = True
        self._close_instance()

    # ------------------------------------------------------------------------------------- helpers
    def _read(self, text: str) -> tuple[tuple[str, dict[str, Any]] | None, str]:
        """``((name, arguments), "")`` of a well-formed call of a tool, else ``(None, why not)``."""
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None, f"the reply is not a tool call; call one of the tools: {self.spec.listing}"
        name, args = obj["name"], obj.get("arguments", {})
        params = self.spec.params.get(name)
        if params is None:
            return None, f"there is no tool {name!r}; the tools are: {self.spec.listing}"
        if not isinstance(args, dict):
            return None, f"{name}: the arguments must be an object, got {json.dumps(args)[:60]}"
        props = params.get("properties", {})
        unknown = [a for a in args if a not in props]
        if unknown:
            return None, f"{name} takes no argument {unknown[0]!r}; its arguments: {', '.join(props) or 'none'}"
        missing = [a for a in params.get("required", []) if a not in args]
        if missing:
            return None, f"{name} needs the argument {missing[0]!r}"
        for arg, value in args.items():
            why = check_value(value, props[arg], arg)
            if why:
                return None, f"{name}: {why}"
        return (name, args), ""

    def _invalid(self, why: str, tool_error: bool = False) -> StepResult:
        info: dict[str, Any] = {"invalid": True, "error": why}
        if tool_error:
            info["tool_error"] = True
        return StepResult(f"Invalid tool call: {why}", 0.0, False, info)

    def _close_instance(self) -> None:
        obj, self._obj = self._obj, None
        close = getattr(obj, "close", None)
        if callable(close):
            close()
