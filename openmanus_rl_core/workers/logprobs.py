"""Log-probabilities of response tokens under a causal LM (the batch layout is in :mod:`openmanus_rl_core.workers`)."""

from __future__ import annotations

import torch

from openmanus_rl_core.batch import Batch


def sequence_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    pack: bool = False,
    share_prompts: bool = False,
    with_choices: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-probabilities of the response tokens under ``model`` (see the module docstring for the layout).

    Returns ``(logp, entropy, choice_logp)``: ``logp [B, R]``; when ``with_entropy`` (else None), the entropy of
    ``softmax(logits / T)`` per response position ``[B, R]``; when ``with_choices`` and the batch has
    ``choice_ids`` (else None), the log-probabilities of every token a constraint allowed ``[B, R, K]``, laid out
    as ``choice_ids`` (0 where it has -1). Where the batch's ``choice_ids`` name the allowed tokens, all three are
    those of the distribution over them alone (:func:`_over_choices`). Only the last ``R + 1`` positions' logits
    are materialised. The columns that are padding in every row are cut before the forward pass
    (:func:`~.microbatch.trim_columns`); every result is 0 on every padding position.

    ``pack``: no padding at all. The rows' real tokens are concatenated into one sequence whose position ids restart
    at 0 for each row, with no attention mask: transformers then masks attention to each row's own tokens (its
    packed-sequence masks for sdpa/eager; flash-attention varlen on GPU).

    ``share_prompts``: rows whose prompts start alike (a GRPO group's samples, per-turn samples of one task) run
    that start once (:mod:`openmanus_rl_core.models.shared_prompt`); not with ``pack``. The model must keep its KV cache
    (the actor turns this off under gradient checkpointing).
    """
    from openmanus_rl_core.workers.microbatch import pad_columns, trim_columns

    small, R = trim_columns(batch)
    pack = pack and bool(small["attention_mask"].any())  # rows of padding only: nothing to pack
    shared = _shared_prompts(small) if share_prompts and not pack else None
    if shared is not None:
        out = _shared_prompt_logprobs(model, small, temperature, with_entropy, shared, with_choices)
    else:
        out = (_packed_logprobs if pack else _logprobs)(model, small, temperature, with_entropy, with_choices)
    if not R:
        return out
    real = batch["attention_mask"][:, -R:].to(out[0].dtype)  # 0 on padding, however rows are grouped
    return tuple(None if t is None else pad_columns(t, R) * real.view(*real.shape, *[1] * (t.dim() - 2))
                 for t in out)


def _logprobs(model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool, with_choices: bool):
    responses = batch["responses"]
    R = responses.shape[1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        logits_to_keep=R + 1,
    )
    return _response_logprobs(out.logits[:, -R - 1:-1, :], responses, temperature, with_entropy,
                              batch.get("choice_ids"), with_choices)


def _response_logprobs(logits: torch.Tensor, responses: torch.Tensor, temperature: float, with_entropy: bool,
                       choices: torch.Tensor | None = None, with_choices: bool = False):
    """``(logp, entropy, choice_logp)`` of ``responses`` [B, R] from the logits that predict them [B, R, V], as
    :func:`sequence_logprobs` returns them; at the positions ``choices`` names (a batch's ``choice_ids``), those of
    the distribution over the allowed tokens only (:func:`_over_choices`)."""
    from openmanus_rl_core.algorithms import entropy_from_logits

    logits = logits.float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / float(temperature)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    if choices is None:
        return logp, entropy, None
    return _over_choices(logits, responses, choices, logp, entropy, with_choices)


def _over_choices(logits: torch.Tensor, responses: torch.Tensor, choices: torch.Tensor, logp: torch.Tensor,
                  entropy: torch.Tensor | None, with_choices: bool):
    """The policy that decoded under a constraint: at a position where ``choices[b, t]`` lists the tokens the
    grammar allowed (ids, then -1 padding; all -1 where the reply was free), the model's distribution renormalised
    over them, as the engine sampled from it: ``logp = z[token] - logsumexp(z[allowed])``, the entropy over the
    allowed tokens and (``with_choices``) each allowed token's log-probability ``[B, R, K]``, 0 where ``choices``
    is -1. A forced token (one allowed) reads log-probability 0 and entropy 0. Elsewhere ``logp`` and ``entropy``
    are returned as given."""
    on, allowed = choices[..., 0] >= 0, choices >= 0
    z = logits.gather(-1, choices.clamp_min(0)).masked_fill(~allowed, float("-inf"))
    z = torch.where(on.unsqueeze(-1), z, torch.zeros_like(z))  # a free position: any finite row, not read
    token = logits.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(on, token - torch.logsumexp(z, dim=-1), logp)
    if entropy is None and not with_choices:  # the log-probs alone (old and reference log-probs)
        return logp, None, None
    lsm = torch.log_softmax(z, dim=-1).masked_fill(~allowed, 0.0)
    if entropy is not None:
        entropy = torch.where(on, -(lsm.exp() * lsm).masked_fill(~allowed, 0.0).sum(-1), entropy)
    return logp, entropy, lsm if with_choices else None


def _shared_prompts(batch: Batch):
    """:func:`~openmanus_rl_core.models.shared_prompt.shared_starts` of the rows' prompt columns (None: share nothing)."""
    from openmanus_rl_core.models.shared_prompt import shared_starts

    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    return shared_starts(*(batch[k][:, :P] for k in ("input_ids", "attention_mask", "position_ids")))


def _shared_prompt_logprobs(model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool, shared,
                            with_choices: bool):
    """As :func:`_logprobs`, with each shared prefix run once (``shared``: a
    :class:`~openmanus_rl_core.models.shared_prompt.SharedStarts`): its KV cache is repeated for the rows that share it,
    then the rest of every row (the rest of its prompt and the response but its last token) runs on that cache."""
    from openmanus_rl_core.models.loading import cache_keyword

    ids, attn, pos, responses = (batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses"))
    R = responses.shape[1]
    start = ids.shape[1] - R - shared.width
    kw = cache_keyword(model)
    head = model(input_ids=shared.head_ids, attention_mask=shared.head_mask, position_ids=shared.head_pos,
                 use_cache=True, logits_to_keep=1)
    cache = getattr(head, kw)
    cache.batch_select_indices(shared.which)
    mask = torch.cat([shared.prefix_mask, shared.rest_mask, attn[:, -R:-1]], dim=1)
    tail = model(input_ids=ids[:, start:-1], attention_mask=mask, position_ids=pos[:, start:-1], use_cache=True,
                 logits_to_keep=R, **{kw: cache})
    logp, entropy, choice_logp = _response_logprobs(tail.logits, responses, temperature, with_entropy,
                                                    batch.get("choice_ids"), with_choices)
    # The first pass's last layer gives only keys and values to the second; its output joins the graph with weight
    # 0 so that FSDP2, which gathers a layer's weights for backward when its output's gradient arrives, gathers it.
    return logp + 0.0 * head.logits.sum(), entropy, choice_logp


def _packed_logprobs(model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool, with_choices: bool):
    """As :func:`_logprobs`, on the rows packed into one sequence ``[1, sum of row lengths]``."""
    responses = batch["responses"]
    R = responses.shape[1]
    real = batch["attention_mask"].bool()
    out = model(input_ids=batch["input_ids"][real].unsqueeze(0), position_ids=batch["position_ids"][real].unsqueeze(0),
                attention_mask=None, use_cache=False)
    # Where each (row, column) sits in the packed sequence; response token t is predicted one position earlier.
    where = real.flatten().long().cumsum(0).view_as(real) - 1
    at = (where[:, -R:] - 1).clamp_min(0)
    return _response_logprobs(out.logits[0][at], responses, temperature, with_entropy,  # [B, R, V]
                              batch.get("choice_ids"), with_choices)
