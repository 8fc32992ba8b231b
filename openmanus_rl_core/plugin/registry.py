"""Lazy registries of plugin components, read from Python entry points.

Listing reads distribution metadata only (importlib-metadata): no component module is imported until a
config selects it. A name provided by two distributions must be qualified as ``dist:name``; an unknown
name is answered with close matches; a component whose import fails raises :class:`PluginLoadError`
naming its distribution and entry point, only when that component is used.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import importlib_metadata

KINDS: dict[str, str] = {
    "env": "openmanus_rl.envs",
    "reward": "openmanus_rl.rewards",
    "template": "openmanus_rl.templates",
    "allocator": "openmanus_rl.allocators",
    "advantage": "openmanus_rl.advantages",
    "loss": "openmanus_rl.losses",
    "engine": "openmanus_rl.engines",
    "memory": "openmanus_rl.memories",
}
"""Component kind -> entry-point group."""

HOOKS_GROUP = "openmanus_rl"
"""Entry-point group of pluggy hook modules (see :mod:`openmanus_rl_core.hookspecs`)."""


class PluginError(Exception):
    """Base of every error about finding or loading a plugin component."""


class UnknownPluginError(PluginError, LookupError):
    pass


class AmbiguousPluginError(PluginError, LookupError):
    pass


class PluginLoadError(PluginError, ImportError):
    pass


@dataclass(frozen=True)
class PluginEntry:
    """One registered component, known from metadata alone."""

    kind: str
    name: str
    value: str  # "module:attr"
    dist: str
    version: str

    @property
    def qualified_name(self) -> str:
        return f"{self.dist}:{self.name}"

    @property
    def module(self) -> str:
        return self.value.split(":", 1)[0].strip()

    @property
    def attr(self) -> str:
        return self.value.split(":", 1)[1].strip() if ":" in self.value else ""

    def static_problem(self) -> str | None:
        """Why this entry cannot load, found without importing anything; None if none is seen.

        Locates the module file through the import system's finders (no module code runs) and checks
        that the attribute is defined at its top level.
        """
        parts = self.module.split(".")
        try:
            spec = _find_spec_without_import(parts[0], None)
            for i in range(1, len(parts)):
                if spec is None or not spec.submodule_search_locations:
                    spec = None
                    break
                spec = _find_spec_without_import(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
        except (ImportError, ValueError) as exc:  # a broken .pth or path entry
            return f"cannot locate module {self.module!r}: {exc}"
        if spec is None:
            return f"module {self.module!r} not found"
        if self.attr and spec.origin and spec.origin.endswith(".py"):
            top = self.attr.split(".")[0]
            try:
                with open(spec.origin, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), spec.origin)
            except (OSError, SyntaxError) as exc:
                return f"module {self.module!r} cannot be read: {exc}"
            if top not in _top_level_names(tree):
                return f"module {self.module!r} defines no {top!r}"
        return None


def _find_spec_without_import(fullname: str, path: list[str] | None):
    """Ask the meta-path finders (PathFinder, editable-install finders) for a spec; runs no module code."""
    if fullname in sys.modules and getattr(sys.modules[fullname], "__spec__", None) is not None:
        return sys.modules[fullname].__spec__
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path) if find else None
        if spec is not None:
            return spec
    return None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):  # conditional definitions count
            names |= _top_level_names(ast.Module(body=list(ast.iter_child_nodes(node)), type_ignores=[]))
    return names


def _dist_of(ep: importlib_metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def entries(kind: str | None = None) -> list[PluginEntry]:
    """Every registered component (of one kind, or all), sorted by kind and name. Imports nothing."""
    kinds = [kind] if kind else list(KINDS)
    out: list[PluginEntry] = []
    for k in kinds:
        group = _group(k)
        seen: set[tuple[str, str]] = set()
        for ep in importlib_metadata.entry_points(group=group):
            dist, version = _dist_of(ep)
            if (dist, ep.name) in seen:  # the same distribution found twice on sys.path
                continue
            seen.add((dist, ep.name))
            out.append(PluginEntry(k, ep.name, ep.value, dist, version))
    return sorted(out, key=lambda e: (list(KINDS).index(e.kind), e.name, e.dist))


def _group(kind: str) -> str:
    try:
        return KINDS[kind]
    except KeyError:
        raise UnknownPluginError(f"unknown plugin kind {kind!r}; kinds are: {', '.join(KINDS)}") from None


class Registry:
    """The components of one kind. ``get(name)`` loads one; ``build(name, **kw)`` also calls it."""

    def __init__(self, kind: str):
        _group(kind)
        self.kind = kind
        self._loaded: dict[PluginEntry, Any] = {}
        self._entries: list[PluginEntry] | None = None

    def entries(self, refresh: bool = False) -> list[PluginEntry]:
        """The entries of this kind; metadata is read once (about 30 ms) and again on ``refresh``."""
        if refresh or self._entries is None:
            self._entries = entries(self.kind)
        return self._entries

    def names(self) -> list[str]:
        return sorted({e.name for e in self.entries()})

    def resolve(self, name: str) -> PluginEntry:
        """The entry a config name means: ``name`` or ``dist:name``."""
        if not isinstance(name, str) or not name:
            raise UnknownPluginError(f"{self.kind} name must be a non-empty string, got {name!r}")
        dist, _, short = name.rpartition(":")
        for refresh in (False, True):  # a miss re-reads metadata: the plugin may have been installed since
            all_entries = self.entries(refresh=refresh)
            found = [e for e in all_entries if e.name == short and (not dist or _same_dist(e.dist, dist))]
            if found:
                break
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            providers = ", ".join(f"{e.dist} {e.version} ({e.value})" for e in found)
            options = " or ".join(repr(e.qualified_name) for e in found)
            raise AmbiguousPluginError(
                f"{self.kind} {short!r} is provided by more than one distribution: {providers}. "
                f"Select one by qualifying the name, e.g. {options}."
            )
        installed = sorted({e.name for e in all_entries})
        close = difflib.get_close_matches(short, installed, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        where = f" from distribution {dist!r}" if dist else ""
        raise UnknownPluginError(
            f"unknown {self.kind} {name!r}{where}.{hint} Installed {self.kind} names: "
            f"{', '.join(installed) or '(none)'}. `openmanus-rl plugins {self.kind}` lists them."
        )

    def get(self, name: str) -> Any:
        """Import and return the component object (class or function) registered as ``name``."""
        entry = self.resolve(name)
        if entry not in self._loaded:
            self._loaded[entry] = load_entry(entry)
        return self._loaded[entry]

    def build(self, name: str, /, **kwargs: Any) -> Any:
        """``get(name)(**kwargs)``, with a constructor error re-raised naming the component."""
        factory = self.get(name)
        try:
            return factory(**kwargs)
        except TypeError as exc:
            raise TypeError(f"cannot build {self.kind} {name!r} with arguments {sorted(kwargs)}: {exc}") from exc


def _same_dist(a: str, b: str) -> bool:
    norm = lambda s: s.lower().replace("_", "-").replace(".", "-")  # noqa: E731  (PEP 503 normalisation)
    return norm(a) == norm(b)


def load_entry(entry: PluginEntry) -> Any:
    """Import ``entry.value``; any failure becomes a :class:`PluginLoadError` naming the plugin."""
    try:
        obj: Any = importlib.import_module(entry.module)
        for part in filter(None, entry.attr.split(".")):
            obj = getattr(obj, part)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # an import may fail in any way, sys.exit() included: never end the caller unexplained
        raise PluginLoadError(
            f"{entry.kind} plugin {entry.name!r} from distribution {entry.dist} {entry.version} "
            f"(entry point {entry.name} = {entry.value} in group {KINDS.get(entry.kind, HOOKS_GROUP)}) failed to load: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return obj


@lru_cache(maxsize=None)
def registry(kind: str) -> Registry:
    """The registry of one kind (``env``, ``reward``, ``template``, ``allocator``, ...)."""
    return Registry(kind)


def build(kind: str, node: Any, /, **runtime: Any) -> Any:
    """The component ``node.name`` of ``kind``, called with ``node.kwargs`` plus ``runtime`` (objects the caller
    supplies, such as an engine's model). ``node``: a schema node or a mapping with ``name`` and ``kwargs``; the
    plugin checks its own kwargs (a bad one raises naming the component)."""
    get = node.get if isinstance(node, Mapping) else (lambda key: getattr(node, key))
    return registry(kind).build(str(get("name")), **dict(get("kwargs") or {}), **runtime)


def check(entry: PluginEntry) -> str | None:
    """Import one entry for real; the error text if it fails, else None."""
    try:
        load_entry(entry)
    except PluginLoadError as exc:
        return str(exc)
    return None
