"""Find the app of an installed OpenEnv env through its ``openenv.yaml``, without importing it.

An OpenEnv env package (``openenv init`` makes one; ``openenv.auto`` discovers them) ships ``openenv.yaml`` in its
top package: ``app: server.app:app`` names its FastAPI app relative to that package (``echo_env`` ->
``echo_env.server.app:app``). The manifest is found among the distribution's installed files; for an editable
install (whose files are not listed), in the folder of each of its top-level modules.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["Manifest", "find_manifest", "check_app"]

MANIFEST = "openenv.yaml"
_APP = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Manifest:
    """``app``: the importable ``module:attr`` of the env's app; ``name``: the manifest's; ``path``: the file."""

    app: str
    name: str
    path: Path


def _candidates(dist: md.Distribution) -> list[Path]:
    found = [Path(str(dist.locate_file(f))) for f in (dist.files or ()) if f.name == MANIFEST]
    if found:
        return found
    tops = (dist.read_text("top_level.txt") or "").split()
    tops.append(re.sub(r"^openenv[-_]", "", dist.metadata["Name"] or "").replace("-", "_"))
    for top in dict.fromkeys(t for t in tops if t.isidentifier()):
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: finds its folder without running it
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if (Path(folder) / MANIFEST).is_file():
                found.append(Path(folder) / MANIFEST)
    return found


def _module_of(folder: Path, dist: md.Distribution) -> str:
    """The dotted module name of a package folder: its path below the install location (or the import path entry)
    it is nearest to."""
    names = []
    for root in (Path(str(dist.locate_file(""))), *(Path(p or ".") for p in sys.path)):
        try:
            rel = folder.resolve().relative_to(root.resolve())
        except (ValueError, OSError):
            continue
        if rel.parts and all(p.isidentifier() for p in rel.parts):
            names.append(".".join(rel.parts))
    return min(names, key=lambda n: n.count("."), default=folder.name)


def find_manifest(package: str) -> Manifest:
    """The manifest of the installed distribution ``package``; ``ValueError`` (one line, starting with
    ``package=...``) when it is not installed or is not an OpenEnv env."""
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise ValueError(f"package={package}: no installed distribution of that name (pip install it, or give "
                         "a running server as env.kwargs.url)") from None
    paths = _candidates(dist)
    if not paths:
        raise ValueError(f"package={package}: not an OpenEnv env: the distribution has no {MANIFEST} (an env "
                         "without one can be served from its app: env.kwargs.app=module:attr)")
    path = paths[0]
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"package={package}: its {path} does not read as YAML ({exc})".splitlines()[0]) from None
    app = data.get("app") if isinstance(data, dict) else None
    if not isinstance(app, str) or not _APP.match(app):
        raise ValueError(f"package={package}: its {path} names no app (expected `app: server.app:app`, got "
                         f"{app!r})")
    module, attr = app.split(":")
    base = _module_of(path.parent, dist)
    full = f"{base}.{module}" if base else module
    check_app(f"{full}:{attr}", key=f"package={package}")
    return Manifest(f"{full}:{attr}", str(data.get("name") or package), path)


def check_app(app: str, key: str | None = None) -> None:
    """``module:attr`` names a module that exists (found without running it); ``ValueError`` otherwise."""
    key = key or f"app={app}"
    if not isinstance(app, str) or not _APP.match(app):
        raise ValueError(f"{key}: not module:attr (e.g. my_env.server.app:app)")
    module = app.split(":")[0]
    parts = module.split(".")
    top = importlib.util.find_spec(parts[0])
    if top is None:
        raise ValueError(f"{key}: no module {parts[0]!r} is installed")
    folders = list(top.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], 1):
        nxt = [Path(f) / part for f in folders]
        if i == len(parts) - 1:
            if not any(p.with_suffix(".py").is_file() or (p / "__init__.py").is_file() for p in nxt):
                raise ValueError(f"{key}: no module {module!r} is installed")
            return
        folders = [str(p) for p in nxt if p.is_dir()]
        if not folders:
            raise ValueError(f"{key}: no module {module!r} is installed")
