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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens under ``model`` (see the module docstring for the layout).

    Returns ``logp [B, R]`` and, when ``with_entropy``, the entropy of ``softmax(logits / T)`` per response
    position ``[B, R]`` (else None). Only the last ``R + 1`` positions' logits are materialised. The columns that
    are padding in every row are cut before the forward pass (:func:`~.microbatch.trim_columns`); both results
    are 0 on every padding position.

    ``pack``: no padding at all. The rows' real tokens are concatenated into one sequence whose position ids restart
    at 0 for each row, with no attention mask: transformers then masks attention to each row's own tokens (its
    packed-sequence masks for sdpa/eager; flash-attention varlen on GPU).
    """
    from openmanus_rl_core.workers.microbatch import pad_columns, trim_columns

    small, R = trim_columns(batch)
    pack = pack and bool(small["attention_mask"].any())  # rows of padding only: nothing to pack
    logp, entropy = (_packed_logprobs if pack else _logprobs)(model, small, temperature, with_entropy)
    real = batch["attention_mask"][:, -R:].to(logp.dtype) if R else None  # 0 on padding, however rows are grouped
    logp = pad_columns(logp, R) * real if R else logp
    if entropy is not None and R:
        entropy = pad_columns(entropy, R) * real
    return logp, entropy


def _logprobs(model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool):
    from openmanus_rl_core.algorithms import entropy_from_logits

    responses = batch["responses"]
    R = responses.shape[1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        logits_to_keep=R + 1,
    )
    logits = out.logits[:, -R - 1:-1, :].float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / float(temperature)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return logp, entropy



def _packed_logprobs(model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool):
    """As :func:`_logprobs`, on the rows packed into one sequence ``[1, sum of row lengths]``."""
    from openmanus_rl_core.algorithms import entropy_from_logits

    responses = batch["responses"]
    R = responses.shape[1]
    real = batch["attention_mask"].bool()
    out = model(input_ids=batch["input_ids"][real].unsqueeze(0), position_ids=batch["position_ids"][real].unsqueeze(0),
                attention_mask=None, use_cache=False)
    # Where each (row, column) sits in the packed sequence; response token t is predicted one position earlier.
    where = real.flatten().long().cumsum(0).view_as(real) - 1
    at = (where[:, -R:] - 1).clamp_min(0)
    logits = out.logits[0][at].float()  # [B, R, V]
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / float(temperature)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return logp, entropy
