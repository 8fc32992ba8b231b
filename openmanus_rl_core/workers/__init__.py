"""The actor and critic workers: Ray actors that hold FSDP2-sharded models.

Two kinds of worker, each a plain class that the driver wraps with ``ray.remote``:

- :class:`ActorWorker` -- the policy. Holds the trainable model sharded with ``fully_shard`` (FSDP2), its
  optimizer and learning-rate schedule, a frozen reference policy when KL is on, and its own rollout engine
  (:class:`~openmanus_rl_core.engines.hf.HFEngine`) over an *unsharded* copy of the model. After each update the
  full state dict is gathered (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``: rank 0 receives
  it), broadcast to the other ranks over a CPU (gloo) group, and loaded into every rank's engine in memory.
  Each rank runs the agent loop over its own share of the tasks with its own envs.
- :class:`CriticWorker` -- the value model for PPO/GAE: the backbone of the same causal LM plus a linear value
  head, FSDP2-sharded, with its own optimizer.

``N`` workers of a group form one ``torch.distributed`` process group (gloo on CPU, NCCL on GPU); the driver picks
``MASTER_ADDR``/``MASTER_PORT`` and the ranks. Every method that touches the sharded model is a collective: the
driver calls it on every rank of the group with equally sized shards of the batch.

Token layout of a training batch (what :func:`openmanus_rl_core.rollout.build_batch` produces), ``P`` prompt and
``R`` response positions::

    input_ids      [B, P + R]   prompt (left-padded) followed by the response (right-padded)
    attention_mask [B, P + R]
    position_ids   [B, P + R]
    responses      [B, R]       response token ids (agent and observation tokens of a multi-turn episode)
    response_mask  [B, R]       1 on agent tokens (the ones trained), 0 on observations and padding

The log-probability of response token ``t`` is read from the logits at position ``P + t - 1``:
``logp[b, t] = log_softmax(logits[b, P + t - 1] / T)[responses[b, t]]`` with ``T`` the rollout temperature.

How the ranks hold the model is ``actor.sharding`` / ``critic.sharding`` (FSDP2 full shard, gradients and optimizer
sharded, or a replica per rank; :mod:`openmanus_rl_core.distributed.fsdp`); micro-batches follow a token budget with
rows bucketed by length (:mod:`.microbatch`, docs/update.md).

Files: :mod:`.base` (process group, seeding, the update loop both roles share, checkpoint state), :mod:`.actor`,
:mod:`.critic`, :mod:`.logprobs`, :mod:`.microbatch`, :mod:`.rng`. The group that runs them is
:class:`~openmanus_rl_core.distributed.worker_group.WorkerGroup`.
"""

from openmanus_rl_core.workers.actor import ActorWorker
from openmanus_rl_core.workers.base import Worker
from openmanus_rl_core.workers.critic import CriticWorker, ValueModel
from openmanus_rl_core.workers.logprobs import sequence_logprobs
from openmanus_rl_core.workers.rng import capture_worker_rng, restore_worker_rng

__all__ = ["Worker", "ActorWorker", "CriticWorker", "ValueModel", "sequence_logprobs", "capture_worker_rng",
           "restore_worker_rng"]
