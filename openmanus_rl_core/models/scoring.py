"""The policy as a scorer of given replies: the log-probability of continuation tokens after a prompt, under a
causal LM in this process. Plugins receive it in the ``openmanus_rl_policy_metrics`` hook (validation and ``eval``)
to measure the policy itself, e.g. its probability of each legal move of a game."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["continuation_logprobs", "PolicyScorer"]


def continuation_logprobs(model: Any, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                          pad_id: int, batch_rows: int = 64) -> list[float]:
    """``sum_t log p(c_t | prompt, c_<t)`` for each (prompt, continuation) pair of token ids, in order.

    Rows are right-padded to the longest in a batch of ``batch_rows``, so a row's positions are those of its tokens
    alone; the logits are taken in float32. An empty continuation scores 0.
    """
    import torch

    if len(prompts) != len(continuations):
        raise ValueError(f"continuation_logprobs: {len(prompts)} prompts for {len(continuations)} continuations")
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(prompts), batch_rows):
        pairs = list(zip(prompts[start:start + batch_rows], continuations[start:start + batch_rows]))
        rows = [list(p) + list(c) for p, c in pairs]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        for i, (p, c) in enumerate(pairs):
            if not c:
                out.append(0.0)
                continue
            at = torch.arange(len(p) - 1, len(p) + len(c) - 1)  # the logits that predict each continuation token
            out.append(float(logp[i, at, torch.tensor(list(c), dtype=torch.long)].sum()))
    return out


@dataclass
class PolicyScorer:
    """What the ``openmanus_rl_policy_metrics`` hook receives: the run's ``tokenizer`` and action ``template``, and
    ``score(prompts, continuations) -> list[float]``, each continuation's summed token log-probability after its
    prompt under the policy being measured (token ids in, ids the tokenizer made)."""

    tokenizer: Any
    template: Any
    score: Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], list[float]]
