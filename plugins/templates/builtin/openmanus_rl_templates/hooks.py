"""Contributes this package's Hydra configs (``template=react``, ``agentgym``, ``json_tool``, ``qwen_tools``,
``llama3_tools``, ``hermes_tools``, ``message``)."""

from __future__ import annotations

from pathlib import Path

from openmanus_rl_core.hookspecs import hookimpl


@hookimpl
def openmanus_rl_config_dirs() -> list[str]:
    return [str(Path(__file__).parent / "configs")]
