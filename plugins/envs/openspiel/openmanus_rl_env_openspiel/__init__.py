"""The ``openspiel`` env for openmanus-rl: OpenSpiel's sequential games as text, one game per task, against fixed
opponents (see :mod:`openmanus_rl_env_openspiel.env`), and the policy's exploitability as a metric
(:mod:`openmanus_rl_env_openspiel.exploitability`)."""

from openmanus_rl_env_openspiel.env import INSTRUCTION, OpenSpielEnv

__all__ = ["OpenSpielEnv", "INSTRUCTION"]
