"""The commands of ``openmanus-rl`` other than the fit loop's internals: train, eval, rollout, data."""
