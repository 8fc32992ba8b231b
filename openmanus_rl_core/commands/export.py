"""``openmanus-rl export trainer.checkpoint=<step dir or run dir> export.dir=<dir>``: a checkpoint as a Hugging
Face folder.

The folder holds ``config.json``, ``model.safetensors`` (LoRA adapters merged into the base weights), the tokenizer
with its chat template, and ``generation_config.json`` (EOS and pad from the tokenizer), so
``AutoModelForCausalLM.from_pretrained(dir)`` and ``model.path=<dir>`` both take it as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXPORT_INFO = "omrl_export.json"
"""Written next to the weights: the checkpoint and step the folder came from."""


def export(cfg: Any) -> int:
    from openmanus_rl_core.checkpoint import load_checkpoint_model
    from openmanus_rl_core.config import ConfigError

    if not cfg.trainer.checkpoint:
        raise ConfigError("trainer.checkpoint: required; give a checkpoints/step_N folder or a run directory")
    if not cfg.export.dir:
        raise ConfigError("export.dir: required; give the folder to write the Hugging Face model to")
    out = Path(cfg.export.dir).expanduser()
    if out.exists() and any(out.iterdir()) and not cfg.export.overwrite:
        raise ConfigError(f"export.dir={out}: the folder is not empty; choose another or set export.overwrite=true")
    model, tokenizer, meta = load_checkpoint_model(cfg.trainer.checkpoint, cfg.model)
    if not tokenizer.chat_template:
        raise ConfigError(f"{meta['checkpoint']}: the tokenizer has no chat template; set model.chat_template")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / EXPORT_INFO).write_text(json.dumps({"checkpoint": meta["checkpoint"], "step": meta.get("step")}, indent=2))
    print(f"exported step {meta.get('step')} of {meta['checkpoint']} to {out}", flush=True)
    return 0
