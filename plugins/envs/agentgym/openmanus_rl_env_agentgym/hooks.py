"""Hook module (entry-point group ``openmanus_rl``): contributes ``configs/env/<name>.yaml`` for every AgentGym env."""

from __future__ import annotations

from pathlib import Path

from openmanus_rl_core.hookspecs import hookimpl


@hookimpl
def openmanus_rl_config_dirs() -> list[str]:
    return [str(Path(__file__).parent / "configs")]
