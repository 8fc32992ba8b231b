from openmanus_rl_env_sciworld.env import SciWorldEnv

__all__ = ["SciWorldEnv"]
