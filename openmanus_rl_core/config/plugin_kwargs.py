"""Plugin-owned settings checked with the schema, before any run folder, Ray or model exists.

A plugin's kwargs (``env.kwargs``, ``template.kwargs``, ``allocator.kwargs``, ``memory.kwargs``,
``rollout.engine_kwargs``, ``reward.components.<label>.kwargs``) are checked against what the plugin takes:

- its declared kwargs, when the component has a ``Kwargs`` dataclass attribute (names, and types from the field
  annotations); the dataclass is then built from them, so its ``__post_init__`` can check values and rules across
  fields (a ``ValueError`` there is the line, after the key: ``memory.kwargs.<its message>``);
- else its constructor's (or function's) signature: the parameter names, and the types of annotated parameters.
  A constructor with ``**kwargs`` takes any name.

A tracker (a ``trainer.loggers`` name, a hook plugin) takes settings at ``trainer.tracker_kwargs.<name>`` only
when its hook object declares a ``Kwargs`` dataclass; it reads them with :func:`tracker_settings`.

A reward component's ``weight`` must be a finite number, and its spec may only have the keys the composer reads.
A problem raises :class:`~openmanus_rl_core.config.loading.ConfigError`: one line naming the key and the value, with
"did you mean" for a misspelled name. Checking imports the selected components (not their dependencies' models).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import types
import typing
from typing import Any, Iterator, Mapping

_SIMPLE = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
           dict: "a mapping"}


def check_plugin_kwargs(c: Any) -> None:
    """Every selected component's kwargs, and every reward component's spec, against what the plugin takes."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.plugin.registry import registry

    for key, kind, name, kwargs in _plugin_nodes(c):
        if not kwargs:
            continue
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"{key}={kwargs!r}: must be a mapping of the {kind} {name!r}'s arguments")
        check_kwargs(key, f"{kind} {name!r}", registry(kind).get(name), kwargs)
    check_tracker_kwargs(list(c.trainer.loggers or []), c.trainer.tracker_kwargs or {})


def check_env_run(c: Any) -> None:
    """A training run's env rules across sections, when the env's class (or factory) has ``check_run(kwargs, cfg)``:
    e.g. an env whose episodes of one group play one game together needs the rollout to run them that way. Its
    ``ValueError`` is the line (it starts with the key it names)."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.plugin.registry import registry

    rule = getattr(registry("env").get(c.env.name), "check_run", None)
    if not callable(rule):
        return
    kwargs = c.env.kwargs or {}
    if hasattr(kwargs, "_get_node"):  # a DictConfig: plain values
        from omegaconf import OmegaConf

        kwargs = OmegaConf.to_container(kwargs, resolve=True)
    try:
        rule(dict(kwargs), c)
    except ValueError as exc:
        raise ConfigError(f"{exc} (env {c.env.name!r})") from None


def check_tracker_kwargs(loggers: list[str], given: Mapping[str, Any]) -> None:
    """``trainer.tracker_kwargs``: each key a selected tracker, each tracker's settings against its ``Kwargs``."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.plugin.manager import hook_entries
    from openmanus_rl_core.plugin.registry import load_entry

    for name, kwargs in given.items():
        key = f"trainer.tracker_kwargs.{name}"
        if name not in loggers:
            close = difflib.get_close_matches(str(name), loggers, n=1, cutoff=0.6)
            hint = f"did you mean trainer.tracker_kwargs.{close[0]}?" if close else "add it to trainer.loggers"
            raise ConfigError(f"{key}: {name!r} is not a tracker of trainer.loggers=[{','.join(loggers)}]; {hint}")
        if not kwargs:
            continue
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"{key}={kwargs!r}: must be a mapping of the tracker {name!r}'s settings")
        entry = next(e for e in hook_entries() if e.name == name)  # installed: config._check_loggers said so
        tracker = load_entry(entry)
        if not dataclasses.is_dataclass(getattr(tracker, "Kwargs", None)):
            first = next(iter(kwargs))
            raise ConfigError(f"{key}.{first}={_show(kwargs[first])}: the tracker {name!r} ({entry.dist}) takes no "
                              f"settings")
        check_kwargs(key, f"tracker {name!r}", tracker, kwargs)


def tracker_settings(cfg: Any, name: str, kwargs_cls: type) -> Any:
    """A tracker's ``Kwargs`` from ``trainer.tracker_kwargs.<name>`` of the config a hook receives (checked before
    the run started)."""
    given = cfg.trainer.tracker_kwargs or {}
    settings = given.get(name) or {}
    if hasattr(settings, "_get_node"):  # a DictConfig: plain values
        from omegaconf import OmegaConf

        settings = OmegaConf.to_container(settings, resolve=True)
    return kwargs_cls(**dict(settings))


def _plugin_nodes(c: Any) -> Iterator[tuple[str, str, str, Any]]:
    """``(key of the kwargs, kind, name, kwargs)`` of every selected plugin component."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.rewards.composer import _SPEC_KEYS

    for kind in ("env", "template", "allocator", "memory"):
        node = getattr(c, kind)
        yield f"{kind}.kwargs", kind, node.name, node.kwargs
    yield "rollout.engine_kwargs", "engine", c.rollout.engine, c.rollout.engine_kwargs
    for label, spec in (c.reward.components or {}).items():
        at = f"reward.components.{label}"
        spec = spec or {}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{at}={spec!r}: must be a mapping with keys {', '.join(_SPEC_KEYS)}")
        for k in spec:
            if k not in _SPEC_KEYS:
                raise ConfigError(_unknown_line(f"{at}.{k}", spec[k], list(_SPEC_KEYS), f"reward component {label!r}"))
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"{at}.weight={weight}: must be a finite number (e.g. 1.0)")
        if not spec.get("path"):  # a scorer in a Python file is checked by the reward-file check
            yield f"{at}.kwargs", "reward", spec.get("name") or str(label), spec.get("kwargs")


def check_kwargs(key: str, what: str, factory: Any, kwargs: Mapping[str, Any]) -> None:
    """``kwargs`` (set at ``key``) against ``factory``'s declared ``Kwargs`` dataclass or its signature."""
    from openmanus_rl_core.config import ConfigError

    accepted = accepted_kwargs(factory)
    if accepted is None:  # no signature to read: the plugin checks its kwargs when built
        return
    names, open_ended = accepted
    for name, value in kwargs.items():
        if name not in names:
            if open_ended:
                continue
            raise ConfigError(_unknown_line(f"{key}.{name}", value, list(names), what))
        tp, default = names[name]
        if not _fits(value, tp, default):
            raise ConfigError(f"{key}.{name}={_show(value)}: must be {_describe(tp, default)} ({what})")
    declared = getattr(factory, "Kwargs", None)
    if dataclasses.is_dataclass(declared):
        try:
            declared(**kwargs)
        except (TypeError, ValueError) as exc:  # a missing required name, or the plugin's own value rules
            line = str(exc) if str(exc).startswith(key) else f"{key}.{exc}"
            raise ConfigError(f"{line} ({what})") from None


def accepted_kwargs(factory: Any) -> tuple[dict[str, tuple[Any, Any]], bool] | None:
    """``({name: (type or None, default)}, takes any other name)`` of a component; None when unreadable."""
    declared = getattr(factory, "Kwargs", None)
    if dataclasses.is_dataclass(declared):
        hints = _hints(declared)
        return {f.name: (hints.get(f.name), f.default) for f in dataclasses.fields(declared)}, False
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    hints = _hints(target)
    names, open_ended = {}, False
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            open_ended = True
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names[p.name] = (hints.get(p.name), None if p.default is inspect.Parameter.empty else p.default)
    return names, open_ended


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj)
    except Exception:  # an annotation that does not resolve here: the names are still checked
        return {}


def _fits(value: Any, tp: Any, default: Any) -> bool:
    """Whether ``value`` can be ``tp`` (True for a type this check does not know)."""
    if tp is None or tp is Any:
        return True
    if value is None:
        return default is None or _optional(tp) or tp is type(None)
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is getattr(types, "UnionType", ()):
        return any(_fits(value, a, default) for a in typing.get_args(tp) if a is not type(None))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    base = origin or tp
    if base in (list, tuple, typing.Sequence):
        return isinstance(value, (list, tuple))
    if base in (dict, typing.Mapping):
        return isinstance(value, Mapping)
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is str:
        return isinstance(value, str)
    return True


def _optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _describe(tp: Any, default: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        typing.Union, getattr(types, "UnionType", ())) else [tp]
    words = " or ".join("one of " + ", ".join(map(repr, typing.get_args(a))) if typing.get_origin(a) is typing.Literal
                        else _SIMPLE.get(typing.get_origin(a) or a, getattr(a, "__name__", str(a))) for a in args)
    return f"{words} or null" if _optional(tp) or default is None else words


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _unknown_line(key: str, value: Any, known: list[str], what: str) -> str:
    parent, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, known, n=3, cutoff=0.6)
    hint = (f"did you mean {' or '.join(f'{parent}.{c}' for c in close)}?" if close
            else f"it takes {', '.join(known) or 'no arguments'}")
    return f"{key}={_show(value)}: unknown key of the {what}; {hint}"
