"""A reward-model reward component (entry point ``reward_model``): see :mod:`openmanus_rl_reward_model.scorer`."""

from openmanus_rl_reward_model.scorer import RewardModelScorer

__all__ = ["RewardModelScorer"]
