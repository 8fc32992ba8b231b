"""The policy update overlapping the rollout (``rollout.overlap_update``; docs/async.md).

In the group stream at η=0 a step's B groups finish one by one, and the slowest sets when the batch is complete.
The update need not wait for it: the loss is a sum over tokens, and a group-baseline advantage needs only its
own group. So each time complete groups come in (:meth:`OverlappedUpdate.add`; the stream hands them over in the
batch's tail, once at most ``HANDOVER_RUNNING_SHARE`` of its groups still play, rollout/stream.py):

- their rewards are composed (once: the step's metrics reuse them) and their advantages computed;
- each actor rank adds the policy gradient of its share to its gradients (``ActorWorker.accumulate``: every
  token's loss times one, no division yet).

The step's end (:meth:`OverlappedUpdate.step`) divides by the batch's response tokens and takes the one optimizer
step (``ActorWorker.step_accumulated``). Within float rounding, that is the update the whole batch gives at once:
the same weights, the same loss. The weights do not change until then, so every gradient is on-policy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from openmanus_rl_core.rewards.composer import RewardBreakdown
from openmanus_rl_core.rollout.episode import Episode


class OverlappedUpdate:
    """One step's chunks so far. ``trainer``: the :class:`~openmanus_rl_core.run.trainer.Trainer` whose composer,
    allocator, estimator and actor group it uses."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.begin()

    def begin(self) -> None:
        """A new step: no chunk yet (also after a step that failed half-way)."""
        self.composed: dict[int, RewardBreakdown] = {}  # id(episode) -> its rewards
        self.tokens = 0.0  # response tokens accumulated, all ranks
        self.seconds = 0.0  # time spent on chunks (while the rest of the batch still played)
        self.chunks = 0  # calls that added episodes

    def add(self, episodes: Sequence[Episode]) -> None:
        """Complete groups (whole groups only) into the gradients; episodes already added are skipped."""
        from openmanus_rl_core.distributed.sharding import shard_batch
        from openmanus_rl_core.rollout import build_batch
        from openmanus_rl_core.run.worker_inputs import actor_batch

        new = [e for e in episodes if id(e) not in self.composed]
        if not new:
            return
        t0 = time.perf_counter()
        tr = self.trainer
        breakdowns, _ = tr.composer.compose_batch([e.trajectory for e in new])
        self.composed.update({id(e): b for e, b in zip(new, breakdowns)})
        batch = build_batch(new, breakdowns, tr.allocator, tr.pad_token_id, tr.cfg.rollout.keep_env_errors)
        scratch: dict[str, float] = {}  # the step's metrics come from the whole batch (Trainer.phase_advantages)
        tr.phase_log_probs(batch, scratch)
        tr.phase_advantages(batch, scratch)
        shards, _ = shard_batch(actor_batch(batch, tr.correction), tr.actor.size)
        self.tokens += sum(tr.actor.call_each("accumulate", [(s,) for s in shards]))
        self.seconds += time.perf_counter() - t0
        self.chunks += 1

    def breakdowns(self, episodes: Sequence[Episode]) -> list[RewardBreakdown]:
        """The rewards composed for ``episodes`` (all added before)."""
        return [self.composed[id(e)] for e in episodes]

    def step(self) -> list[dict[str, float]]:
        """The optimizer step on every rank; their metrics."""
        return self.trainer.actor.call("step_accumulated", total_tokens=self.tokens)
