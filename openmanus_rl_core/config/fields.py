"""How a schema field is declared -- its default, its one-line help, its bounds, the commands that read it -- and
the one error a bad configuration value raises."""

from __future__ import annotations

import copy
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value: one line naming the key, the value and what is allowed."""


def opt(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
        choices: tuple | None = None, commands: tuple[str, ...] | None = None,
        instead: dict[str, str] | None = None) -> Any:
    """A schema field: its default, its one-line meaning and its allowed values; ``commands``: the only commands
    that read it (another command refuses it, with ``instead[command]``'s advice)."""
    meta = {"help": help, "ge": ge, "gt": gt, "choices": choices, "commands": commands, "instead": instead}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


# The commands that read a command-specific key (a field's ``commands``).
ROLLOUT = ("rollout",)
FROM_CHECKPOINT = ("eval", "export", "rollout", "serve", "replay")
