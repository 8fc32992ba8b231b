"""Our :class:`~openmanus_rl_core.protocols.SamplingParams` as vLLM's, one per request.

Seeding (why per-request seeds and no chunked prefill): each request gets its own vLLM seed, drawn from this
engine's ``generator``, so vLLM gives it a private ``torch.Generator`` that advances by one draw per sampled token.
A reply then depends only on (seed, weights, prompt) -- not on which other requests share a scheduler step, how
much of the prompt the prefix cache already holds, or whether the request was preempted and recomputed (vLLM keeps
its generator; the recompute is one prefill followed by one sample, as before the preemption). The one scheduler
behaviour that breaks this is chunked prefill: vLLM samples every scheduled request, including one whose prompt is
only partly computed, throws that token away and rewinds the request's generator with ``set_offset(get_offset() -
4)``. Offsets exist only for CUDA's Philox generators (the CPU generator raises "CPU Generator does not use
offset") and even there tie the stream to vLLM's sampler internals. So the engine runs vLLM with
``enable_chunked_prefill=False`` and ``max_num_batched_tokens >= max_model_len``: a prompt is always prefilled in
one step (a batch whose prompts exceed one step is spread over several steps, whole prompts each), no sample is
ever discarded and no offset is ever read. The alternative -- one engine-wide seed per call -- would make a reply
depend on the batch and on the scheduler's state (prefix cache, KV-cache size, preemptions), so a resumed run would
not sample what the uninterrupted one did.

Constraints (``SamplingParams.constraint``): vLLM's own structured outputs, with the grammar
:func:`~openmanus_rl_core.engines.constrained.to_lark` writes for ``hf`` -- ``StructuredOutputsParams(grammar=...)``
(vLLM >= 0.11; ``GuidedDecodingParams`` before) on the ``guidance`` backend (:func:`structured_outputs_backend`),
i.e. the same llguidance grammar as ``hf``. vLLM applies the grammar's bitmask to the logits before its sampler, so
the log-probabilities it returns (raw or processed) are those of the masked distribution, as ``hf``'s are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from openmanus_rl_core.engines.constrained import to_lark
from openmanus_rl_core.protocols import Constraint, SamplingParams

__all__ = ["RequestParams", "structured_outputs_backend"]

log = logging.getLogger(__name__)


def structured_outputs_backend() -> dict[str, Any]:
    """``LLM(...)`` keyword arguments that put vLLM's structured outputs on llguidance (the ``guidance`` backend),
    whose Lark dialect :func:`~openmanus_rl_core.engines.constrained.to_lark` writes; ``{}`` on a vLLM without."""
    try:
        from vllm.config import StructuredOutputsConfig
    except ImportError:
        from openmanus_rl_core.engines.vllm_memory import engine_arg_exists

        return {"guided_decoding_backend": "guidance"} if engine_arg_exists("guided_decoding_backend") else {}
    return {"structured_outputs_config": StructuredOutputsConfig(backend="guidance")}


def _structured(constraint: Constraint) -> tuple[str, Any]:
    """``(vLLM SamplingParams keyword, value)`` of one constraint."""
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:  # vLLM < 0.11
        from vllm.sampling_params import GuidedDecodingParams

        return "guided_decoding", GuidedDecodingParams(grammar=to_lark(constraint))
    return "structured_outputs", StructuredOutputsParams(grammar=to_lark(constraint))


class RequestParams:
    """``request_params(params, max_tokens, seed, constraint)``: vLLM's ``SamplingParams`` of one request -- its own
    seed, the sampled token's log-probability (``logprobs=0``), EOS ids as stop tokens, stop strings kept in the
    output, and ``constraint`` (this request's, or None) as vLLM's structured outputs."""

    def __init__(self, vllm: Any, eos_token_ids: Iterable[int]):
        self.vllm_params = vllm.SamplingParams
        self.top_k_off = int(vllm.SamplingParams().top_k)  # "no top-k": 0 in current vLLM, -1 in older ones
        self.eos_token_ids = set(eos_token_ids)
        self.warned_greedy_temperature = False

    def __call__(self, params: SamplingParams, max_tokens: int, seed: int,
                 constraint: Constraint | None = None) -> Any:
        greedy = bool(params.greedy) or params.temperature is None or params.temperature <= 0
        if greedy:
            if (params.temperature and params.temperature > 0 and abs(params.temperature - 1.0) > 1e-6
                    and not self.warned_greedy_temperature):
                log.warning("VLLMEngine: greedy with temperature=%s: vLLM's greedy log-probs are log_softmax(logits) "
                            "(temperature 1), HFEngine's are log_softmax(logits / %s)", params.temperature,
                            params.temperature)
                self.warned_greedy_temperature = True
            temperature, top_p, top_k = 0.0, 1.0, self.top_k_off
        else:
            temperature = float(params.temperature)
            top_p = float(params.top_p) if params.top_p is not None else 1.0
            top_k = int(params.top_k) if params.top_k and int(params.top_k) > 0 else self.top_k_off
        stops = [s for s in (params.stop or []) if s]
        extra = dict([_structured(constraint)]) if constraint is not None else {}
        return self.vllm_params(
            n=1,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_tokens=int(max_tokens),
            stop=stops or None,
            stop_token_ids=sorted(self.eos_token_ids) or None,
            include_stop_str_in_output=True,
            logprobs=0,
            seed=int(seed),
            skip_special_tokens=True,
            # vLLM's incremental detokenizer is needed only to find stop strings; ``text`` is decoded here.
            detokenize=bool(stops),
            **extra,
        )
