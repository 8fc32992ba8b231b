"""openmanus-rl: train LLM agents with reinforcement learning.

``train``, ``evaluate``: the commands as functions (:mod:`openmanus_rl_core.api`); ``load_config`` and ``Trainer``
for a loop of your own. Imported on first use: ``import openmanus_rl_core`` imports no torch.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {"train": "openmanus_rl_core.api:train", "evaluate": "openmanus_rl_core.api:evaluate",
            "load_config": "openmanus_rl_core.config.loading:load", "Trainer": "openmanus_rl_core.run.trainer:Trainer"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'openmanus_rl_core' has no attribute {name!r}")
    import importlib

    module, attr = _EXPORTS[name].split(":")
    return getattr(importlib.import_module(module), attr)
