from openmanus_rl_env_textcraft.env import TextCraftEnv

__all__ = ["TextCraftEnv"]
