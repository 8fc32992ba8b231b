"""TextWorld games for openmanus-rl (entry point ``textworld``).

Games are made offline by ``tw-make`` (seed = task id), cached on disk, and played through TextWorld's gym
API; the env turns TextWorld's cumulative score into per-step rewards and knows the winning policy
(``oracle_action``). Pre-generate games with ``python -m openmanus_rl_env_textworld.games 0-255``.

Names are loaded lazily, so ``python -m openmanus_rl_env_textworld.games`` does not import its module twice.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TextWorldEnv": "env",
    "INSTRUCTION": "env",
    "clean_action": "env",
    "clean_observation": "env",
    "GameCache": "games",
    "GameGenerationError": "games",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
