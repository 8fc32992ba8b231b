"""The ``textarena`` env for openmanus-rl: TextArena's single-player text games, one game per task, TextArena's own
observations and rewards (see :mod:`openmanus_rl_env_textarena.env`)."""

from openmanus_rl_env_textarena.env import DEFAULT_INSTRUCTION, TextArenaEnv

__all__ = ["TextArenaEnv", "DEFAULT_INSTRUCTION"]
