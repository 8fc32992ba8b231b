"""Weights & Biases tracker for openmanus-rl (see :mod:`openmanus_rl_wandb.hooks`)."""
