"""``openmanus-rl export trainer.checkpoint=<step dir or run dir> export.dir=<dir>``: a checkpoint as a Hugging
Face folder.

The folder holds ``config.json``, ``model.safetensors`` (LoRA adapters merged into the base weights), the tokenizer
with its chat template, and ``generation_config.json`` (EOS and pad from the tokenizer), so
``AutoModelForCausalLM.from_pretrained(dir)`` and ``model.path=<dir>`` both take it as it is. The model section
(folder, dtype, LoRA, chat template) comes from the checkpoint's run unless the command line names it
(:mod:`.from_run`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

EXPORT_INFO = "omrl_export.json"
"""Written next to the weights: the checkpoint and step the folder came from."""


def export(cfg: Any, overrides: Sequence[str] = ()) -> int:
    from openmanus_rl_core.commands.from_run import adopt_run_config, load_policy
    from openmanus_rl_core.config import ConfigError

    if not cfg.trainer.checkpoint:
        raise ConfigError("trainer.checkpoint: required; give a checkpoints/step_N folder or a run directory")
    if not cfg.export.dir:
        raise ConfigError("export.dir: required; give the folder to write the Hugging Face model to")
    out = Path(cfg.export.dir).expanduser()
    if out.exists() and any(out.iterdir()) and not cfg.export.overwrite:
        raise ConfigError(f"export.dir={out}: the folder is not empty; choose another or set export.overwrite=true")
    c, ckpt = adopt_run_config(cfg, overrides)
    model, tokenizer, weights = load_policy(c, ckpt)
    if not tokenizer.chat_template:
        raise ConfigError(f"{ckpt.path}: the tokenizer has no chat template; set model.chat_template")
    model.load_state_dict(weights, strict=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / EXPORT_INFO).write_text(json.dumps({"checkpoint": str(ckpt.path), "step": ckpt.step}, indent=2))
    umask = os.umask(0)  # read it back: some writers create private (0600) files
    os.umask(umask)
    for f in out.rglob("*"):
        if f.is_file():  # every file the same permissions, as the umask says
            f.chmod(0o666 & ~umask)
    print(f"exported step {ckpt.step} of {ckpt.path} to {out}", flush=True)
    return 0
