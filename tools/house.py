"""The shape of the core, checked: top-level modules, import circles, arrows pointing up, file lengths.

    python -m tools.house            # prints the report, exits 1 when a rule is broken

Every import counts, wherever it sits: a lazy import inside a function, or one under ``if TYPE_CHECKING:``, is still
an arrow between the two files.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "openmanus_rl_core"
MAX_TOP_LEVEL_MODULES = 6
MAX_LINES = 450
# The floors above the rest, lowest first: a module may import from its own floor or below, never from above
# (the workers, the rollout and the engines never import the run; the run never imports a command).
FLOORS = ("run", "commands", "cli", "api")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the package."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports: ``from pkg import sub`` names the submodule, not ``pkg``."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def floor(name: str) -> int:
    """0 for every package below the run; 1 + the index in :data:`FLOORS` for those above."""
    part = name.split(".")[1] if "." in name else ""
    return FLOORS.index(part) + 1 if part in FLOORS else 0


def report(root: Path) -> list[str]:
    """One line per broken rule; empty when the house is in order."""
    known = modules(root)
    # A package's own __init__ is reached by importing any of its submodules, but is not an arrow of its own.
    graph = {name: imports(name, path, known) for name, path in known.items()}
    problems = []
    top = sorted(p.name for p in (root / PACKAGE).glob("*.py") if p.name != "__init__.py")
    if len(top) > MAX_TOP_LEVEL_MODULES:
        problems.append(f"{len(top)} modules at the top of {PACKAGE} (at most {MAX_TOP_LEVEL_MODULES}): {', '.join(top)}")
    for name in sorted(graph):
        for target in sorted(graph[name]):
            if floor(target) > floor(name):
                problems.append(f"arrow up: {name} imports {target}")
    for component in circles(graph):
        problems.append("import circle: " + " <-> ".join(component))
    for name, path in known.items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"{path.relative_to(root)}: {lines} lines (at most {MAX_LINES})")
    return problems


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    problems = report(root)
    for line in problems:
        print(line)
    known = modules(root)
    print(f"{len(known)} modules; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
