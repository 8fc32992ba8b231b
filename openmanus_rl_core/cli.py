"""The ``openmanus-rl`` command.

    openmanus-rl plugins [KIND] [--json] [--check]
    openmanus-rl train   [--cfg job] [key=value ...]      # Hydra overrides, e.g. env=key_door algorithm=ppo
    openmanus-rl rollout [--cfg job] [key=value ...]
    openmanus-rl eval    [--cfg job] [key=value ...]
    openmanus-rl data make [--cfg job] [key=value ...]
    openmanus-rl config-doc                                # docs/configuration.md, from the schema
    openmanus-rl data verify env=<name> data.val_files=<file>   # replay each row's demonstration through the env

Listing plugins imports no component and no torch; the other commands import their module only when run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Sequence

from openmanus_rl_core import registry
from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.envs import EnvUnavailableError
from openmanus_rl_core.registry import KINDS, PluginError

# command -> "module:function(cfg)"; imported only when that command runs.
JOBS = {
    "train": "openmanus_rl_core.commands.train:train",
    "rollout": "openmanus_rl_core.commands.rollout:rollout",
    "eval": "openmanus_rl_core.commands.eval:evaluate",
    "data": "openmanus_rl_core.commands.data:make",
}
SUBACTIONS = {"data": ["make", "verify"]}
FROM_RUN_COMMANDS = ("eval", "rollout")


def _plugins(args: argparse.Namespace) -> int:
    from openmanus_rl_core.plugins import hook_entries

    rows = registry.entries(args.kind) + ([] if args.kind else hook_entries())
    records = []
    for e in rows:
        problem = e.static_problem()
        if problem is None and args.check:
            problem = registry.check(e)
        records.append({
            "kind": e.kind, "name": e.name, "distribution": e.dist, "version": e.version,
            "value": e.value, "status": "ok" if problem is None else "broken", "error": problem,
        })
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    if not records:
        print(f"no {args.kind or ''} plugins installed".replace("  ", " "))
        return 0
    cols = ["kind", "name", "distribution", "version", "status"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in records)) for c in cols}
    print("  ".join(c.upper().ljust(widths[c]) for c in cols))
    for r in records:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
        if r["error"]:
            print(f"    ! {r['error']}")
    return 0


def _job(command: str, args: argparse.Namespace) -> int:
    from openmanus_rl_core.config import check, compose, to_yaml

    cfg = compose(list(args.overrides))
    if args.cfg:
        print(to_yaml(cfg), end="")
        return 0
    typed = check(cfg, training=command == "train")  # before the job imports torch or starts anything
    module, func = JOBS[command].split(":")
    if getattr(args, "action", None) not in (None, "make"):
        func = args.action  # `data verify` runs openmanus_rl_core.commands.data:verify
    job = getattr(importlib.import_module(module), func)
    # eval and rollout take what the command line leaves alone from a checkpoint's run (commands/from_run.py)
    kwargs = {"overrides": list(args.overrides)} if command in FROM_RUN_COMMANDS else {}
    return int(job(typed, **kwargs) or 0)


def _config_doc(args: argparse.Namespace) -> int:
    from openmanus_rl_core.config import render_doc

    print(render_doc(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openmanus-rl", description="Train LLM agents with reinforcement learning.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugin components (imports none of them)")
    p.add_argument("kind", nargs="?", choices=list(KINDS), help="only this kind")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true", help="also import each component and report failures")
    p.set_defaults(run=_plugins)
    sub.add_parser("config-doc", help="print every config key with type, default and meaning (Markdown)"
                   ).set_defaults(run=_config_doc)
    for command in JOBS:
        j = sub.add_parser(command, help=f"{command} (Hydra overrides: key=value)")
        j.set_defaults(run=lambda a, c=command: _job(c, a))
        if command in SUBACTIONS:
            j.add_argument("action", choices=SUBACTIONS[command])
        j.add_argument("--cfg", choices=["job"], help="print the composed config and exit")
        j.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. env=key_door trainer.total_steps=10")
    return parser


# Errors whose message says all there is (what was wrong, where, what to do): printed without a traceback.
# module -> class; looked up only in modules the command already imported (the listing imports no torch).
REPORTED_ERRORS = {"openmanus_rl_core.checkpoint": "CheckpointError", "openmanus_rl_core.data": "DataError"}


def _reported(exc: Exception) -> bool:
    classes = tuple(getattr(sys.modules[m], c) for m, c in REPORTED_ERRORS.items() if m in sys.modules)
    return isinstance(exc, classes)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EnvUnavailableError as exc:  # a server down, or every episode failed: the message says which
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        # Hydra's composition and override errors already say what is wrong too; a traceback adds nothing.
        if _reported(exc) or type(exc).__module__.startswith(("hydra.", "omegaconf.")):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
