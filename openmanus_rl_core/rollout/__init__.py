"""The multi-turn agent loop: tasks in, training-ready batches out.

- :mod:`.loop`: :class:`AgentLoop`, one generate call per turn over every live episode (the token layout is in
  its module doc);
- :mod:`.chat`: the chat template's pieces around turns;
- :mod:`.env_pool`: env calls on threads with timeouts;
- :mod:`.episode` and :mod:`.tasks`: what an episode holds, and how a task becomes a group of episodes;
- :mod:`.assembly`: episodes into a batch, the reward placed on tokens;
- :mod:`.metrics` and :mod:`.corpus`: scalars over a rollout, and the tiny tokenizer's corpus.
"""

from openmanus_rl_core.rollout.assembly import build_batch
from openmanus_rl_core.rollout.chat import ChatDelta
from openmanus_rl_core.rollout.corpus import tokenizer_corpus
from openmanus_rl_core.rollout.env_pool import CallStatus, EnvCallPool
from openmanus_rl_core.rollout.episode import Episode
from openmanus_rl_core.rollout.loop import AgentLoop, sampling_params
from openmanus_rl_core.rollout.metrics import rollout_metrics
from openmanus_rl_core.rollout.tasks import expand_tasks, start_task
from openmanus_rl_core.config.schema import RolloutConfig

__all__ = [
    "RolloutConfig",
    "sampling_params",
    "Episode",
    "AgentLoop",
    "CallStatus",
    "ChatDelta",
    "EnvCallPool",
    "expand_tasks",
    "start_task",
    "build_batch",
    "rollout_metrics",
    "tokenizer_corpus",
]
