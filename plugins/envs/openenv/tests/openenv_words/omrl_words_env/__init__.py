"""Words: an OpenEnv env for openmanus-rl's tests. The observation shows a word; the action says it."""
