"""What a resumed run trains on: the run's own settings, with the command line's changes on top.

``openmanus-rl train trainer.run_dir=<run> trainer.resume=auto`` continues the experiment the run started: the base
is the run's ``config.json`` (the settings of its first steps) plus every change recorded since in
``config_history.jsonl``. The command line goes on top, so ``trainer.total_steps=120`` extends a run without
repeating its ``reward=...`` or ``env=...``; a key the command line leaves alone keeps the run's value, not this
version's default.

- Every key whose value differs from the run's is printed in one block (``changed on resume: actor.lr 0.0005 ->
  0.0001``) and appended, with the step it takes effect in, to ``config_history.jsonl``. ``config.json`` is never
  rewritten by a resume.
- A change the checkpoint cannot continue under (:data:`FIXED_ON_RESUME`: the model's shape and tokenizer, the env
  and its task ids, the worker layout) stops the command with one line (exit 2); start a new run for it.

``trainer.resume=<checkpoint or run directory>`` takes that run's settings the same way. Nothing is taken with
``trainer.resume`` null or ``never`` (a fresh start).

A run stopped before its first checkpoint is resumed the same way: its ``config.json`` is its settings, and it starts
again from its beginning (warm-up included). A run folder that holds checkpoints or metrics but no ``config.json``
is refused: nothing says what experiment it was.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

HISTORY_FILE = "config_history.jsonl"
RECORD_FILE = "config.json"

# Keys a checkpoint depends on: its weights' shape, its tokenizer, the tasks it trained on, its worker layout.
FIXED_ON_RESUME = ("env.name", "env.kwargs", "env.train_tasks", "env.val_tasks", "env.num_tasks", "seed",
                   "data.seed", "data.train_files", "data.val_files", "model.path", "model.tiny",
                   "model.corpus_tasks", "model.lora.enabled", "model.lora.r", "model.lora.target_modules",
                   "algorithm.use_critic", "trainer.num_workers")
# Keys that say where and how to resume: never a change of the experiment.
_NOT_SETTINGS = ("trainer.resume", "trainer.run_dir")


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": leaf}`` of a nested mapping; an empty mapping and any list are leaves."""
    if isinstance(tree, Mapping) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def unflatten(flat: Mapping[str, Any]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def run_dir_of(resume: str, run_dir: str | None) -> Path | None:
    """The run folder whose settings ``trainer.resume`` continues, or None (a fresh start)."""
    mode = str(resume).lower() if resume is not None else "null"  # YAML turns true/null into non-strings
    if mode in ("null", "none", "false", "", "never"):
        return None
    if mode in ("auto", "true"):
        return Path(run_dir).expanduser() if run_dir else None
    path = Path(str(resume)).expanduser()
    return path.parent.parent if path.parent.name == "checkpoints" else path


def run_settings(run: Path) -> dict[str, Any] | None:
    """The run's settings now, flattened: ``config.json`` with every recorded change applied; None without a
    record."""
    record = run / RECORD_FILE
    if not record.is_file():
        return None
    flat = flatten(json.loads(record.read_text()))
    history = run / HISTORY_FILE
    if history.is_file():
        for line in history.read_text().splitlines():
            if line.strip():
                for key, change in json.loads(line)["changes"].items():
                    flat = {k: v for k, v in flat.items() if not _under(k, [key])}
                    flat[key] = change["to"]
    return flat


def resumed_config(cfg: DictConfig, overrides: Sequence[str], plain: Callable[[], DictConfig]
                   ) -> tuple[DictConfig, dict[str, tuple[Any, Any]]]:
    """``(config, changes)``: with ``trainer.resume`` into a run that has a record and a checkpoint, the run's
    settings with what the command line sets on top, and ``{key: (run's value, new value)}`` for every key that
    differs; else ``(cfg, {})``. ``plain()`` composes the config without overrides (this version's defaults), to
    tell what the command line chose from what it merely defaults.

    Raises :class:`~openmanus_rl_core.config.loading.ConfigError` for a change of a :data:`FIXED_ON_RESUME` key."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.loading import _schema_node, schema_keys

    run = run_dir_of(cfg.trainer.resume, cfg.trainer.run_dir)
    saved = run_settings(run) if run is not None else None
    if saved is None:
        if run is not None and (any((run / "checkpoints").glob("step_*")) or (run / "metrics.jsonl").is_file()):
            raise ConfigError(f"trainer.resume={cfg.trainer.resume}: {run} holds a run's checkpoints or metrics but "
                              f"no {RECORD_FILE}, so its settings are unknown; give the run folder that holds "
                              f"{RECORD_FILE}, or start a new run (another trainer.run_dir)")
        return cfg, {}
    known = schema_keys()
    saved = {k: v for k, v in saved.items() if _under(k, known)}  # keys an older version had are dropped
    cli = flatten(OmegaConf.to_container(cfg, resolve=True))
    defaults = flatten(OmegaConf.to_container(plain(), resolve=True))
    # What the command line chose: a group option (``reward=process``) replaces that whole section, a key its
    # value; an option file's keys (``+experiment=...``) are the ones that differ from the plain composition.
    groups = [o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o]
    chosen = {k for k in set(cli) | set(defaults) if cli.get(k, KeyError) != defaults.get(k, KeyError)}
    chosen |= {k for k in cli if _under(k, groups)}
    merged = {k: v for k, v in saved.items() if not _under(k, [g for g in groups if "." not in g])}
    for k in chosen:
        merged.pop(k, None)
        if k in cli:
            merged[k] = cli[k]
    changes = {k: (_value_at(saved, k), _value_at(merged, k)) for k in sorted(set(saved) | set(merged))
               if saved.get(k, KeyError) != merged.get(k, KeyError) and not _under(k, _NOT_SETTINGS)}
    for fixed in FIXED_ON_RESUME:  # in the order of that tuple: the env's name before its kwargs
        k = next((k for k in changes if _under(k, [fixed])), None)
        if k is not None:
            old, new = changes[k]
            raise ConfigError(f"{k}={_show(new)}: the run in {run} was started with {k}={_show(old)}, and it "
                              f"cannot continue under another value; drop the override to continue the run, or "
                              f"start a new run (another trainer.run_dir)")
    node = OmegaConf.merge(_schema_node(), unflatten(merged))
    return node, changes


def _value_at(flat: Mapping[str, Any], key: str) -> Any:
    """The value at ``key``: a leaf, or the mapping of the leaves below it (None when there are none)."""
    if key in flat:
        return flat[key]
    below = {k[len(key) + 1:]: v for k, v in flat.items() if k.startswith(key + ".")}
    return unflatten(below) if below else None


def _show(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """The block printed on resume: one line per changed key."""
    if not changes:
        return "resumed with the run's own settings (nothing changed)"
    return "changed on resume:\n" + "\n".join(f"  {k}: {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())


def record_changes(run_dir: Path, step: int, changes: Mapping[str, tuple[Any, Any]]) -> None:
    """Append the changes that take effect in ``step`` to the run's config history (never rewritten)."""
    if not changes:
        return
    row = {"step": int(step), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "changes": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}}
    with open(Path(run_dir) / HISTORY_FILE, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
