"""The ``textarena`` env for openmanus-rl: TextArena's text games, single-player or against a fixed opponent, one
game per task, TextArena's own observations and rewards (see :mod:`openmanus_rl_env_textarena.env`)."""

from openmanus_rl_env_textarena.env import DEFAULT_INSTRUCTION, TWO_PLAYER_INSTRUCTION, TextArenaEnv

__all__ = ["TextArenaEnv", "DEFAULT_INSTRUCTION", "TWO_PLAYER_INSTRUCTION"]
