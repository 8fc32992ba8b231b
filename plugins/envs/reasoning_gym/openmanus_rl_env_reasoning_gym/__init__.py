"""The ``reasoning_gym`` env for openmanus-rl: Reasoning Gym's procedural datasets, one generated item per task,
scored by the dataset's own ``score_answer`` (see :mod:`openmanus_rl_env_reasoning_gym.env`)."""

from openmanus_rl_env_reasoning_gym.env import DEFAULT_INSTRUCTION, ReasoningGymEnv

__all__ = ["ReasoningGymEnv", "DEFAULT_INSTRUCTION"]
