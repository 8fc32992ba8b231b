"""Contributes this package's Hydra configs (``env=word_copy``, ``env=key_door``, ``env=guess_number``, ``env=relay``)."""

from __future__ import annotations

from pathlib import Path

from openmanus_rl_core.hookspecs import hookimpl


@hookimpl
def openmanus_rl_config_dirs() -> list[str]:
    return [str(Path(__file__).parent / "configs")]
