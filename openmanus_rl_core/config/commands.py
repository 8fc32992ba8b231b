"""The settings only one command reads: ``export``, ``serve``, ``replay`` (sections of :class:`~.schema.Config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from openmanus_rl_core.config.fields import opt


@dataclass
class ExportConfig:
    """`openmanus-rl export`: a checkpoint as a Hugging Face folder (LoRA merged)."""

    dir: Optional[str] = opt(None, "the folder to write (config, safetensors, tokenizer, chat template, generation "
                                   "config); required", commands=("export",))
    overwrite: bool = opt(False, "replace a non-empty export.dir", commands=("export",))


@dataclass
class ServeConfig:
    """`openmanus-rl serve`: the gateway alone, in front of a checkpoint or a model folder."""

    host: str = opt("127.0.0.1", "the address to listen on (loopback: this machine only)", commands=("serve",))
    port: int = opt(8000, "the port to listen on (0: a free one)", ge=0, commands=("serve",))
    api_key: Optional[str] = opt(None, "the key clients must send (null: a new one, printed at start)",
                                 commands=("serve",))


@dataclass
class ReplayConfig:
    """`openmanus-rl replay`: a run's updates again, from its rollout dumps (trainer.save_rollouts), without an env."""

    rollouts: Optional[str] = opt(None, "the dumps' folder (null: <run_dir>/rollouts of trainer.checkpoint's run)",
                                  commands=("replay",))
    steps: Optional[str] = opt(None, "the steps to replay, K..M (null: every step after the checkpoint's that the "
                                     "dumps hold, in a row)", commands=("replay",))
