"""Reward components from a Python file (verl's ``custom_reward_function`` layout): ``path`` + ``function``.

:func:`check_reward_file` reads the file before anything runs (it parses, and binds ``function`` at its top
level); :func:`load_reward_file` imports it as a module of its own when the composer is built. Every error is a
:class:`RewardFileError` naming the reward's label, the file and the function.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

__all__ = ["DEFAULT_FUNCTION", "RewardFileError", "check_reward_file", "load_reward_file"]

DEFAULT_FUNCTION = "compute_score"
"""The function a ``path:`` reward component names when it gives no ``function`` (verl's name)."""


class RewardFileError(ValueError):
    """A ``path:`` reward component that cannot be used; the message names the label, the file and the function."""


def _file_and_function(label: str, spec: Mapping[str, Any]) -> tuple[Path, str]:
    if spec.get("name"):
        raise RewardFileError(f"reward {label!r}: give either name (an installed reward plugin) or path (a Python "
                              f"file), not both (name={spec['name']!r}, path={spec['path']!r})")
    path = Path(str(spec["path"])).expanduser()
    function = str(spec.get("function") or DEFAULT_FUNCTION)
    if not path.is_file():
        raise RewardFileError(f"reward {label!r}: path={spec['path']} is not a file; give the Python file that "
                              f"defines {function}(data_source, solution_str, ground_truth, extra_info)")
    return path, function


def check_reward_file(label: str, spec: Mapping[str, Any]) -> None:
    """Before anything runs: the file exists, parses, and defines ``function`` at its top level (read, not run)."""
    path, function = _file_and_function(label, spec)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        raise RewardFileError(f"reward {label!r}: {path} line {exc.lineno}: {exc.msg}") from None
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if function not in defined + _bound_names(tree):
        raise RewardFileError(f"reward {label!r}: {path} defines no function {function!r} (its functions: "
                              f"{', '.join(defined) or 'none'}); set function=<name>")


def _bound_names(tree: ast.Module) -> list[str]:
    """Names a module binds at its top level other than by ``def``: ``f = g``, ``f: T = g``, ``a, f = ...``,
    ``from m import g as f``, ``import f``."""
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        for target in targets:
            names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
    return names


def load_reward_file(label: str, spec: Mapping[str, Any]) -> Callable[..., Any]:
    """The scorer ``spec["function"]`` of the Python file ``spec["path"]``, imported as a module of its own (no
    package, no ``sys.path`` change)."""
    path, function = _file_and_function(label, spec)
    module_name = f"openmanus_rl_reward_file_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardFileError(f"reward {label!r}: importing {path} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise RewardFileError(f"reward {label!r}: {path} has no function {function!r}"
                              + ("" if fn is None else f" ({function} is a {type(fn).__name__})"))
    return fn
