"""What each worker's pass reads of a step's batch: only those tensors are shipped to the ranks.

- a forward pass (old, reference log-probs; values): :data:`LEAN_KEYS`, the tokens and the response mask;
- the critic's update: :func:`critic_batch`;
- the actor's update: :func:`actor_batch`, whose response mask holds only the tokens the policy chose.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LEAN_KEYS", "actor_batch", "critic_batch"]

LEAN_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


def critic_batch(batch: Any) -> Any:
    """The critic's update: the tokens, ``values`` and ``returns``."""
    return batch.select([*LEAN_KEYS, "values", "returns"])


def actor_batch(batch: Any, correction: str) -> Any:
    """The actor's update: the tokens, ``advantages``, the old and reference log-probs where the step has them,
    and the engine's under the ``tis`` rollout correction (``correction``: ``algorithms/correction.py``).

    Its ``response_mask`` holds the tokens the policy chose. A token a constraint forced (``forced``,
    ``rollout.constrain_actions``: the grammar allowed no other) was no decision: it leaves the policy loss, the
    entropy bonus and the KL, and their token means average over the choices alone. The batch's own
    ``response_mask`` keeps it, since the reward and the advantages are placed over the whole reply."""
    keys = [*LEAN_KEYS, "advantages", *(k for k in ("old_log_probs", "ref_log_probs") if k in batch),
            *(["rollout_log_probs"] if correction == "tis" else [])]
    out = batch.select(keys)
    if "forced" in batch:
        out["response_mask"] = batch["response_mask"] * (1 - batch["forced"])
    return out
