"""MLflow tracker for openmanus-rl (see :mod:`openmanus_rl_mlflow.hooks`)."""
