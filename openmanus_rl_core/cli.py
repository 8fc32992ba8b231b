"""The ``openmanus-rl`` command.

    openmanus-rl plugins [KIND | hooks | options] [--json] [--check]
    openmanus-rl train   [--cfg job] [key=value ...]      # Hydra overrides, e.g. env=key_door algorithm=ppo
    openmanus-rl rollout [--cfg job] [key=value ...]
    openmanus-rl eval    [--cfg job] [key=value ...]
    openmanus-rl export  trainer.checkpoint=<step dir or run dir> export.dir=<dir>   # a Hugging Face folder
    openmanus-rl serve   trainer.checkpoint=<step dir or run dir> | model.path=<dir>   # an OpenAI-compatible endpoint
    openmanus-rl data make [--cfg job] [key=value ...]
    openmanus-rl config-doc                                # docs/configuration.md, from the schema
    openmanus-rl data verify env=<name> data.val_files=<file>   # replay each row's demonstration through the env
    openmanus-rl data from-rollouts env=<name> data.rollouts=<rollout folder>   # demonstrations from trajectories

Listing plugins imports no component and no torch; the other commands import their module only when run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from openmanus_rl_core.plugin import registry
from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.engines import EngineUnavailableError
from openmanus_rl_core.plugin.envs import EnvUnavailableError
from openmanus_rl_core.plugin.registry import KINDS, PluginError
from openmanus_rl_core.rewards.failures import RewardFailure

# command -> "module:function(cfg)"; imported only when that command runs. A two-word command is a sub-action.
JOBS = {
    "train": "openmanus_rl_core.commands.train:train",
    "rollout": "openmanus_rl_core.commands.rollout:rollout",
    "eval": "openmanus_rl_core.commands.eval:evaluate",
    "export": "openmanus_rl_core.commands.export:export",
    "serve": "openmanus_rl_core.commands.serve:serve",
    "replay": "openmanus_rl_core.commands.replay:replay",
    "data make": "openmanus_rl_core.commands.data:make",
    "data verify": "openmanus_rl_core.commands.data:verify",
    "data from-rollouts": "openmanus_rl_core.commands.data:from_rollouts",
}
FROM_RUN_COMMANDS = ("eval", "rollout", "export", "serve", "replay")
# Commands that train: their config is checked for training, and a resumed run continues its own settings with the
# command line's changes on top.
TRAINING_COMMANDS = ("train",)
# Commands that generate with rollout.engine and train nothing (so any engine, a served one too): the engine's own
# start-up check (a served model's server answers) runs before the model is checked.
ENGINE_COMMANDS = ("rollout", "eval")


@dataclass(frozen=True)
class Help:
    """What ``openmanus-rl <command> --help`` says: the purpose, the keys most runs set, two commands that work."""

    purpose: str
    keys: tuple[str, ...]
    examples: tuple[str, str]


HELP = {
    "train": Help("Train a policy with RL (PPO/GRPO/...) on an env; writes metrics, TensorBoard, checkpoints and "
                  "rewards.png into the run directory.",
                  ("env", "algorithm", "model.path", "model.lora.enabled", "trainer.total_steps", "actor.lr",
                   "trainer.run_dir", "trainer.loggers"),
                  ("openmanus-rl train env=key_door trainer.total_steps=20",
                   "openmanus-rl train env=word_copy algorithm=ppo model.lora.enabled=true trainer.loggers=[tensorboard,wandb]")),
    "rollout": Help("Play tasks with a model (no training) and write the episodes as JSONL.",
                    ("env", "model.path", "rollout.num_tasks", "rollout.n", "rollout.output_dir", "rollout.greedy"),
                    ("openmanus-rl rollout env=key_door rollout.num_tasks=8 rollout.n=2",
                     "openmanus-rl rollout env=guess_number model.path=exported/ rollout.greedy=true")),
    "eval": Help("Score a checkpoint (or model.path) on the env's validation tasks: success rate and mean reward.",
                 ("trainer.checkpoint", "env", "model.path", "trainer.val_max_tasks", "trainer.eval_output"),
                 ("openmanus-rl eval trainer.checkpoint=outputs/2026-01-01/12-00-00-key_door",
                  "openmanus-rl eval env=word_copy model.path=exported/ trainer.eval_output=eval.json")),
    "export": Help("Write a checkpoint as a Hugging Face folder: config, safetensors weights (LoRA merged), tokenizer, "
                   "chat template, generation config.",
                   ("trainer.checkpoint", "export.dir", "export.overwrite", "model.chat_template"),
                   ("openmanus-rl export trainer.checkpoint=outputs/2026-01-01/12-00-00-key_door export.dir=exported/",
                    "openmanus-rl export trainer.checkpoint=run/checkpoints/step_000060 export.dir=hf/ "
                    "export.overwrite=true")),
    "serve": Help("Serve a checkpoint (or model.path) at an OpenAI-compatible endpoint on 127.0.0.1, for trying an "
                  "agent by hand; prints the OPENAI_BASE_URL, OPENAI_API_KEY and OMRL_MODEL to use.",
                  ("trainer.checkpoint", "model.path", "serve.port", "serve.api_key", "agent.model_name"),
                  ("openmanus-rl serve trainer.checkpoint=outputs/2026-01-01/12-00-00-key_door",
                   "openmanus-rl serve model.path=exported/ serve.port=8001 serve.api_key=secret")),
    "replay": Help("Replay a run's updates from its rollout dumps (trainer.save_rollouts=true), with no rollout and "
                   "no env; compares the weights with the run's own checkpoint of the last step.",
                   ("trainer.checkpoint", "replay.steps", "replay.rollouts"),
                   ("openmanus-rl replay trainer.checkpoint=run/checkpoints/step_000000 replay.steps=1..5",
                    "openmanus-rl replay trainer.checkpoint=run/checkpoints/step_000010 replay.rollouts=run/rollouts")),
    "data make": Help("Generate an env's task split as train.parquet and val.parquet in data.dir.",
                      ("env", "env.train_tasks", "env.val_tasks", "data.dir", "seed"),
                      ("openmanus-rl data make env=key_door",
                       "openmanus-rl data make env=word_copy env.train_tasks=1000 data.dir=data/word_copy")),
    "data verify": Help("Replay each task row's demonstration through the env; exit 1 when any row fails.",
                        ("env", "data.val_files"),
                        ("openmanus-rl data verify env=key_door data.val_files=data/key_door/val.parquet",
                         "openmanus-rl data verify env=word_copy data.val_files=data/word_copy/train.parquet")),
    "data from-rollouts": Help("Turn a rollout's trajectories into a task file of demonstrations (OpenManus-RL's "
                               "conversations layout): the successful episodes, or those above a reward.",
                               ("data.rollouts", "data.keep", "data.min_reward", "data.output", "env", "template"),
                               ("openmanus-rl data from-rollouts env=key_door data.rollouts=outputs/rollout/",
                                "openmanus-rl data from-rollouts env=key_door data.rollouts=r/trajectories.jsonl "
                                "data.keep=reward data.min_reward=0.5 data.output=demos.parquet")),
}


def key_help(key: str) -> str:
    """A config key's one line: the schema field's help, or a section's docstring (``env``: the env group)."""
    import dataclasses

    from openmanus_rl_core.config.schema import Config

    node: object = Config
    for part in key.split("."):
        field = {f.name: f for f in dataclasses.fields(node)}[part]  # KeyError: HELP names a key the schema lacks
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(default):
            return field.metadata.get("help", "")
        node = type(default)
    return (node.__doc__ or "").strip().splitlines()[0]


def describe(command: str) -> tuple[str, str]:
    """``(description, epilog)`` of ``command``'s ``--help``."""
    h = HELP[command]
    width = max(len(k) for k in h.keys)
    keys = "\n".join(f"  {k.ljust(width)}  {key_help(k)}" for k in h.keys)
    return (f"{h.purpose}\n\nmain keys (every key: openmanus-rl config-doc; the composed config: --cfg job):\n{keys}",
            "examples:\n" + "\n".join(f"  {e}" for e in h.examples))


def config_options() -> list[dict]:
    """Every config group option (``env=textcraft``, ``+experiment=...``) with the distribution that ships it: the
    core's config tree, then each hook plugin's config folders (this imports the hook modules, not components)."""
    from openmanus_rl_core.config.loading import core_config_dir
    from openmanus_rl_core.plugin.manager import make_plugin_manager

    sources = [("openmanus-rl-core", str(core_config_dir()))]
    for impl in make_plugin_manager().hook.openmanus_rl_config_dirs.get_hookimpls():
        sources += [(impl.plugin_name.split(":")[0], str(d)) for d in impl.function() or []]
    import yaml

    chosen = {next(iter(d)) for d in yaml.safe_load((core_config_dir() / "config.yaml").read_text())["defaults"]
              if isinstance(d, dict)}  # a group outside the defaults list is added with `+group=option`
    out = []
    for dist, folder in sources:
        for f in sorted(Path(folder).glob("*/**/*.yaml")):
            group = f.parent.relative_to(folder).as_posix()
            plus = "" if group in chosen else "+"
            out.append({"kind": "option", "name": f"{plus}{group}={f.stem}", "distribution": dist, "value": str(f)})
    return sorted(out, key=lambda r: r["name"])


def _plugins(args: argparse.Namespace) -> int:
    return LISTINGS.get(args.kind, _components)(args)


def _options(args: argparse.Namespace) -> int:
    """``plugins options``: the config group options and the package that ships each."""
    return _print_table(config_options(), args.json, ["kind", "name", "distribution"])


def _components(args: argparse.Namespace) -> int:
    """``plugins [kind|hooks]``: the entry points of one kind, of the hooks, or (no kind) of all of them."""
    from openmanus_rl_core.plugin.manager import hook_entries

    sources = {"hooks": hook_entries, None: lambda: registry.entries(None) + hook_entries()}
    rows = sources.get(args.kind, lambda: registry.entries(args.kind))()
    records = []
    for e in rows:
        problem = e.static_problem()
        if problem is None and args.check:
            problem = registry.check(e)
        records.append({
            "kind": e.kind, "name": e.name, "distribution": e.dist, "version": e.version,
            "value": e.value, "status": "ok" if problem is None else "broken", "error": problem,
        })
    if not records and not args.json:
        print(f"no {args.kind or ''} plugins installed".replace("  ", " "))
        return 0
    return _print_table(records, args.json, ["kind", "name", "distribution", "version", "status"])


# ``plugins <kind>`` choices that are not a plugin kind, and what lists them.
LISTINGS = {"options": _options}


def _print_table(records: list[dict], as_json: bool, cols: list[str]) -> int:
    if as_json:
        print(json.dumps(records, indent=2))
        return 0
    widths = {c: max(len(c), *(len(str(r[c])) for r in records)) for c in cols}
    print("  ".join(c.upper().ljust(widths[c]) for c in cols))
    for r in records:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
        if r.get("error"):
            print(f"    ! {r['error']}")
    return 0


def composed(command: str, overrides: Sequence[str], log=None):
    """``(config node, changes)`` as ``command`` sees ``overrides``: keys the command does not read are refused; a
    resumed training run starts from its own settings (``changes``: what the overrides change of them). ``log``: told
    the options an agent run takes by default (config/loading.py ``agent_options``)."""
    from openmanus_rl_core.config.loading import compose

    check_command_keys(command, overrides)
    cfg = compose(overrides, log=log)
    if command in TRAINING_COMMANDS:  # a resumed run continues its own settings, the command line's changes on top
        from openmanus_rl_core.config.resume import resumed_config

        return resumed_config(cfg, overrides, plain=lambda: compose([]))
    return cfg, {}


def prepare(command: str, overrides: Sequence[str], rewards: Sequence = ()):
    """``(typed config, job kwargs)``: everything checked before the job imports torch or starts anything.
    ``rewards``: reward components given as Python callables (:mod:`~openmanus_rl_core.rewards.callables`); a resumed
    run must be given those it recorded."""
    from openmanus_rl_core.config.loading import check
    from openmanus_rl_core.engines import preflight
    from openmanus_rl_core.models.loading import check_model

    cfg, changes = composed(command, overrides, log=lambda line: print(line, flush=True))
    typed = check(cfg, training=command in TRAINING_COMMANDS)
    if command in TRAINING_COMMANDS:
        changes = {**changes, **callable_changes(typed, rewards)}
        if typed.agent.command or typed.agent.function:  # a missing program is one line, before anything starts
            from openmanus_rl_core.gateway.agents import check_agent

            check_agent(typed.agent)
    # A served model's server answers (engines.preflight), then the model and tokenizer are checked (which imports
    # torch and transformers, seconds): both stop the command before Ray.
    if command in ENGINE_COMMANDS:
        preflight(typed.rollout.engine, typed.rollout.engine_kwargs)
    check_model(typed.model)
    # eval, rollout and export take what the command line leaves alone from a checkpoint's run (commands/from_run.py)
    kwargs: dict = {"overrides": list(overrides)} if command in FROM_RUN_COMMANDS else {}
    if changes:
        from openmanus_rl_core.config.resume import describe_changes

        print(describe_changes(changes), flush=True)
        kwargs = {"changes": changes}
    return typed, kwargs


def callable_changes(typed, rewards: Sequence) -> dict:
    """A resume's change of the run's callable rewards (``{"python_rewards": (recorded, given)}``, or none); the
    recorded ones must be given again (:func:`~openmanus_rl_core.rewards.callables.take_again`)."""
    from openmanus_rl_core.rewards.callables import RECORD_KEY, record, take_again
    from openmanus_rl_core.config.resume import run_dir_of, run_settings

    run = run_dir_of(typed.trainer.resume, typed.trainer.run_dir)
    saved = run_settings(run) if run is not None else None
    if saved is None:
        return {}
    recorded = saved.get(RECORD_KEY) or []
    take_again(recorded, rewards, typed.reward.missing_callables, f"the resume of {run}",
               f"resume from Python with omrl.train([...], rewards={{...}}) giving them")
    given = record(rewards)
    return {} if given == recorded else {RECORD_KEY: (recorded, given)}


def _job(command: str, args: argparse.Namespace) -> int:
    from openmanus_rl_core.config.loading import to_yaml

    if args.cfg:
        print(to_yaml(composed(command, list(args.overrides))[0]), end="")
        return 0
    typed, kwargs = prepare(command, list(args.overrides))
    module, func = JOBS[command].split(":")
    job = getattr(importlib.import_module(module), func)
    return int(job(typed, **kwargs) or 0)


def check_command_keys(command: str, overrides: Sequence[str]) -> None:
    """A key set on the command line that ``command`` never reads (the schema field's ``commands``) is refused,
    naming the commands that read it."""
    import dataclasses

    from openmanus_rl_core.config.schema import Config

    verb = command.split()[0]
    for o in overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        node: object = Config
        for part in key.split("."):
            field = {f.name: f for f in dataclasses.fields(node)}.get(part) if dataclasses.is_dataclass(node) else None
            if field is None:
                break
            readers = field.metadata.get("commands")
            if readers and verb not in readers:
                instead = (field.metadata.get("instead") or {}).get(verb)
                raise ConfigError(f"{key}={value}: {key} is read by {' and '.join(', '.join(readers).rsplit(', ', 1))}"
                                  f", not by {verb}" + (f"; {instead}" if instead else ""))
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
            node = type(default) if dataclasses.is_dataclass(default) else None


def _inspect(args: argparse.Namespace) -> int:
    from openmanus_rl_core.commands.inspect import inspect_run

    return inspect_run(args)


def _config_doc(args: argparse.Namespace) -> int:
    from openmanus_rl_core.config.loading import render_doc

    print(render_doc(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openmanus-rl", description="Train LLM agents with reinforcement learning.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugin components (imports none of them)")
    p.add_argument("kind", nargs="?", choices=[*KINDS, "hooks", *LISTINGS],
                   help="only this kind; `options`: the config group options (env=..., reward=..., +experiment=...) "
                        "and the package that ships each")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true", help="also import each component and report failures")
    p.set_defaults(run=_plugins)
    sub.add_parser("config-doc", help="print every config key with type, default and meaning (Markdown)"
                   ).set_defaults(run=_config_doc)
    p = sub.add_parser("inspect", help="what a run trained on, per step, from its rollout dumps "
                                       "(trainer.save_rollouts=true; writes <run>/rollouts/inspect.html), and an "
                                       "agent run's env_error episodes from <run>/agents")
    p.add_argument("run_dir", metavar="run", help="the run directory")
    p.add_argument("--steps", help="the steps whose samples the HTML page shows, K..M (default: the last one)")
    p.set_defaults(run=_inspect)
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in JOBS:
        group, _, action = command.rpartition(" ")
        if group and group not in groups:
            g = sub.add_parser(group, help=f"{group} {' | '.join(c.split()[1] for c in JOBS if c.startswith(group + ' '))}")
            groups[group] = g.add_subparsers(dest="action", required=True)
        description, epilog = describe(command)
        j = (groups[group] if group else sub).add_parser(
            action, help=HELP[command].purpose, description=description, epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter, prog=f"openmanus-rl {command}")
        j.set_defaults(run=lambda a, c=command: _job(c, a))
        j.add_argument("--cfg", choices=["job"], help="print the composed config and exit")
        j.add_argument("overrides", nargs="*", help="Hydra overrides key=value (see main keys and examples)")
    return parser


# Errors whose message says all there is (what was wrong, where, what to do): printed without a traceback.
# module -> class; looked up only in modules the command already imported (the listing imports no torch).
REPORTED_ERRORS = {"openmanus_rl_core.checkpoint.store": "CheckpointError", "openmanus_rl_core.data.tasks": "DataError",
                   "openmanus_rl_core.models.loading": "ModelError", "openmanus_rl_core.rewards.composer": "RewardFileError",
                   "openmanus_rl_core.run.dumps": "DumpError"}


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
    except BrokenPipeError:  # `openmanus-rl plugins | head`: the reader left; no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (EnvUnavailableError, EngineUnavailableError, RewardFailure) as exc:  # the message says what failed
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
