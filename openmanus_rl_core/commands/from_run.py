"""What ``eval`` and ``rollout`` take from the run a checkpoint belongs to.

A checkpoint saves the whole typed config of its run (``meta.config``). Started with ``trainer.checkpoint=...``,
these commands take the run's env, template, reward, allocator, memory and model sections (with the env its
``rollout.max_turns``), except the sections the command line names (``env=word_copy``, ``model.dtype=bf16``,
...), and print which came from where. ``eval`` scores the run's own validation set (the same task file, the same
``trainer.val_max_tasks``) unless the command line names ``env``, ``data`` or ``trainer.val_max_tasks``. The policy is the run's model folder with the checkpoint's weights
(LoRA adapters merged).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from openmanus_rl_core.rewards.callables import RECORD_KEY
from openmanus_rl_core.config.schema import Config

# The sections a run's checkpoint decides, in the order they are reported.
FROM_RUN = ("env", "template", "reward", "allocator", "memory", "model")
# Keys that say how the command treats the run's section, not what the section is: set on the command line, they go
# on top of the run's section instead of replacing it.
POLICY_KEYS = ("reward.missing_callables",)


@dataclass
class RunCheckpoint:
    """A checkpoint opened for evaluation: its folder, its step, the model folder its run trained (as saved), its
    weights."""

    path: Path
    step: Any
    model_dir: str | None
    weights: dict
    val_source: str | None = None  # where the validation tasks come from, when they are the run's own
    python_rewards: list = dataclasses.field(default_factory=list)  # the run's callable rewards, when its reward is


def named_sections(overrides: Sequence[str]) -> set[str]:
    """Top-level sections the command-line overrides touch (``env=x`` and ``env.kwargs.k=v`` both name ``env``)."""
    return {o.split("=", 1)[0].lstrip("+~").split(".")[0] for o in overrides if "=" in o}


def adopt_run_config(c: Config, overrides: Sequence[str], log: Callable[[str], None] = print,
                     run_validation: bool = False) -> tuple[Config, RunCheckpoint | None]:
    """``(config, checkpoint)``: ``c`` with the checkpoint's run settings in every section of :data:`FROM_RUN`
    the overrides leave alone (with ``run_validation``, also the run's validation set while the env is the run's
    own); ``(c, None)`` without ``trainer.checkpoint``."""
    from omegaconf import OmegaConf

    from openmanus_rl_core.checkpoint.store import open_checkpoint
    from openmanus_rl_core.config.loading import check

    if not c.trainer.checkpoint:
        return c, None
    path, state = open_checkpoint(str(c.trainer.checkpoint), keys=["model", "meta"])
    meta = state.get("meta") or {}
    saved = meta.get("config") or {}
    named = named_sections([o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in POLICY_KEYS])
    taken = [s for s in FROM_RUN if s not in named and s in saved]
    # Each taken section is rebuilt from the schema's defaults plus what the run saved (open mappings such as the
    # reward components start empty, so nothing of this command line's defaults is mixed in).
    sections = {s: OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(type(getattr(c, s))), saved[s]))
                for s in taken}
    for key in POLICY_KEYS:
        section, name = key.split(".")
        if section in sections:
            sections[section] = dataclasses.replace(sections[section], **{name: getattr(getattr(c, section), name)})
    # Only rollout.max_turns itself on the command line overrides the run's (rollout.temperature=... does not).
    max_turns_named = any(o.split("=", 1)[0].lstrip("+~") in ("rollout", "rollout.max_turns") for o in overrides)
    if "env" in taken and not max_turns_named and "max_turns" in saved.get("rollout", {}):
        sections["rollout"] = dataclasses.replace(c.rollout, max_turns=saved["rollout"]["max_turns"])
    val_source = None
    if run_validation and not named & {"data", "env"} and not any(
            o.lstrip("+~").startswith("trainer.val_max_tasks=") for o in overrides):
        sections["data"], sections["trainer"], val_source = _run_validation(c, path, saved)
    c = check(dataclasses.replace(c, **sections), training=False)
    ckpt = RunCheckpoint(path=path, step=meta.get("step"), model_dir=meta.get("model_dir"), weights=state["model"],
                         val_source=val_source,
                         python_rewards=list(meta.get(RECORD_KEY) or []) if "reward" in taken else [])
    described = {"env": c.env.name, "template": c.template.name, "allocator": c.allocator.name,
                 "reward": "+".join(c.reward.components) or "none", "memory": c.memory.name,
                 "model": c.model.path or ckpt.model_dir or "the run's model folder"}
    log(f"checkpoint: {path} (step {ckpt.step})")
    log("from the run: " + (", ".join(f"{s}={described[s]}" for s in taken) or "nothing")
        + ("; from the command line: " + ", ".join(f"{s}={described[s]}" for s in FROM_RUN if s not in taken)
           if len(taken) < len(FROM_RUN) else ""))
    return c, ckpt


def _run_validation(c: Config, path: Path, saved: dict) -> tuple[Any, Any, str | None]:
    """``(data, trainer, where)``: the run's own validation set (the same tasks, the same count) when the command
    line names neither ``data`` nor ``trainer.val_max_tasks``: the run's task file (``<run_dir>/data/val.parquet``
    when it generated one) and its ``trainer.val_max_tasks``."""
    run_data, run_trainer = saved.get("data") or {}, saved.get("trainer") or {}
    generated = path.parent.parent / "data" / "val.parquet"
    files = run_data.get("val_files") or (str(generated) if generated.is_file() else None)
    if files is None:
        return c.data, c.trainer, None
    limit = run_trainer.get("val_max_tasks")
    where = f"the run's validation set ({files}{f', its first {limit}' if limit else ''})"
    return (dataclasses.replace(c.data, val_files=files),
            dataclasses.replace(c.trainer, val_max_tasks=limit), where)


def run_model_dir(path: Path, saved: str | None) -> str:
    """The run's model folder: where the run says, else ``<run_dir>/model`` (a run directory moved elsewhere)."""
    if saved and Path(saved).exists():
        return str(saved)
    candidate = path.parent.parent / "model"
    if not candidate.exists():
        raise FileNotFoundError(f"{path}: its model folder {saved!r} is gone and {candidate} does not exist; pass "
                                f"model.path=<the Hugging Face folder the run started from>")
    return str(candidate)


def load_policy(c: Config, ckpt: RunCheckpoint | None, tokenizer_only: bool = False):
    """``(model, tokenizer, weights)``: the run's model folder and the checkpoint's weights for the engine (LoRA
    adapters merged; push them with ``engine.update_weights``), or ``model.path`` and ``None``. ``None`` when
    neither is given. ``tokenizer_only`` (an engine that serves its model elsewhere): ``(None, tokenizer, None)``."""
    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.models.loading import _dtype, load_tokenizer, lora_scaling, merge_lora_state, transposed_modules

    if ckpt is not None:  # the checkpoint's weights on model.path (a moved run's folder) or the run's own folder
        model_dir = str(Path(c.model.path).expanduser()) if c.model.path else run_model_dir(ckpt.path, ckpt.model_dir)
        weights = ckpt.weights
    elif c.model.path:
        model_dir, weights = str(Path(c.model.path).expanduser()), None
    else:
        return None
    tokenizer = load_tokenizer(model_dir, c.model.chat_template)
    if tokenizer_only:
        return None, tokenizer, None
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=_dtype(c.model.dtype))
    if weights is not None and c.model.lora.enabled:
        weights = merge_lora_state(weights, lora_scaling(c.model.lora), transposed_modules(model))
    return model, tokenizer, weights
