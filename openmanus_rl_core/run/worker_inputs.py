"""What each worker's pass reads of a step's batch: only those tensors are shipped to the ranks.

- a forward pass (old, reference log-probs; values): :func:`lean_batch`, the tokens, the response mask and, where a
  constraint decoded the replies, the tokens it allowed (``choice_ids``: the policy there is the model's
  distribution over them);
- the critic's update: :func:`critic_batch`;
- the actor's update: :func:`actor_batch`, whose response mask holds only the tokens the policy chose.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LEAN_KEYS", "lean_batch", "actor_batch", "critic_batch"]

LEAN_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


def lean_batch(batch: Any) -> Any:
    """A forward pass's log-probs: the tokens, the response mask, and ``choice_ids`` where the batch has them."""
    return batch.select([*LEAN_KEYS, *(["choice_ids"] if "choice_ids" in batch else [])])


def critic_batch(batch: Any) -> Any:
    """The critic's update: the tokens, ``values`` and ``returns``."""
    return batch.select([*LEAN_KEYS, "values", "returns"])


def actor_batch(batch: Any, correction: str) -> Any:
    """The actor's update: the tokens, ``advantages``, the old and reference log-probs where the step has them,
    and the engine's under the ``tis`` rollout correction (``correction``: ``algorithms/correction.py``).

    Where a constraint decoded the replies, ``choice_ids`` go too: the log-probs and the entropy there are those of
    the model's distribution over the allowed tokens, the policy that sampled them. Its ``response_mask`` holds
    the tokens the policy chose. A token a constraint forced (``forced``,
    ``rollout.constrain_actions``: the grammar allowed no other) was no decision: it leaves the policy loss, the
    entropy bonus and the KL, and their token means average over the choices alone. The batch's own
    ``response_mask`` keeps it, since the reward and the advantages are placed over the whole reply."""
    keys = [*LEAN_KEYS, "advantages",
            *(k for k in ("old_log_probs", "ref_log_probs", "choice_ids", "ref_choice_log_probs", "choice_values")
              if k in batch),
            *(["rollout_log_probs"] if correction == "tis" else [])]
    out = batch.select(keys)
    if "forced" in batch:
        out["response_mask"] = batch["response_mask"] * (1 - batch["forced"])
    return out
