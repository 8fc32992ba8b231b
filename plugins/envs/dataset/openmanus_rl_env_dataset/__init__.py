"""The ``dataset`` env for openmanus-rl: single-turn prompts with a ground truth (see
:mod:`openmanus_rl_env_dataset.env`), and a small arithmetic set (:mod:`openmanus_rl_env_dataset.arithmetic`)."""

from openmanus_rl_env_dataset.arithmetic import arithmetic_rows, make_arithmetic
from openmanus_rl_env_dataset.env import DEFAULT_INSTRUCTION, DatasetEnv

__all__ = ["DatasetEnv", "DEFAULT_INSTRUCTION", "arithmetic_rows", "make_arithmetic"]
