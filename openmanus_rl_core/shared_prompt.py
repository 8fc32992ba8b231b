"""Shared prompts: the samples of a GRPO group start from the same prompt, so its tokens are computed once.

A group of ``rollout.n`` samples repeats one prompt ``n`` times. Both places that run the model over whole rows
compute that prompt once per distinct prompt and repeat its keys and values for each sample:

- the HF engine's prefill (:mod:`openmanus_rl_core.engines.hf`): the distinct prompts are prefilled, and the
  KV-cache rows and last logits are repeated per sample before decoding;
- the actor's log-probs and update (:mod:`openmanus_rl_core.workers.logprobs`, ``actor.share_prompts``): the
  prompt part of each distinct row runs with a KV cache, and the responses run on the repeated cache. Gradients
  flow back through the repetition, so each prompt position receives the sum of its samples' gradients: exactly
  what the rows computed one by one give.

Attention and every layer treat the rows independently, so the results are those of the full rows (up to the
float rounding of a different batch shape); ``tests/test_shared_prompt.py`` checks log-probs and gradients.
"""

from __future__ import annotations

import torch

__all__ = ["distinct_rows"]


def distinct_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, which)`` for the rows of ``x`` [B, ...]: ``first[u]`` the first row of distinct row ``u`` (in order
    of first appearance), ``which[b]`` the distinct row of row ``b`` (so ``x[first][which]`` equals ``x``).
    None when no two rows are equal (nothing to share)."""
    B = x.shape[0]
    if B < 2:
        return None
    _, which = torch.unique(x.reshape(B, -1), dim=0, return_inverse=True)
    U = int(which.max()) + 1
    if U == B:
        return None
    rows = torch.arange(B, device=x.device)
    first = torch.full((U,), B, dtype=torch.long, device=x.device).scatter_reduce(0, which, rows, "amin")
    # Number the distinct rows by first appearance (torch.unique sorts them).
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(U, device=x.device)
    return first[order], rank[which]
