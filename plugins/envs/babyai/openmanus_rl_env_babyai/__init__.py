from openmanus_rl_env_babyai.env import AGENTGYM_LEVELS, BabyAIEnv

__all__ = ["AGENTGYM_LEVELS", "BabyAIEnv"]
