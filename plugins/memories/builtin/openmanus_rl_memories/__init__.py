"""Built-in memories of openmanus-rl (see :mod:`openmanus_rl_memories.memories`)."""
