"""Rewards: the composer of weighted components, reward files, callable rewards recorded with a run, and what a
failing component does."""
