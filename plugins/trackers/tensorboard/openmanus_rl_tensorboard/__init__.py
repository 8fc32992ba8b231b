"""TensorBoard tracker for openmanus-rl (see :mod:`openmanus_rl_tensorboard.hooks`)."""
