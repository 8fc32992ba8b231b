"""Streaming from vLLM: what ``LLM.generate`` does for a batch of requests, done step by step on its engine, so that
each step's new tokens can be told as they come (``VLLMEngine.generate(..., on_tokens=...)``; the gateway streams
them to its clients).

Each request asks for its cumulative output (``RequestOutputKind.CUMULATIVE``): after every engine step, the tokens
a request has so far; the ones not yet told go to ``on_tokens(indices, tokens)`` (a prompt index per token). The
finished outputs come back in request order, as ``LLM.generate`` returns them, so the engine reads them the same
way. A failure part way aborts the requests still running, leaving the engine ready for the next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["stepped"]


def stepped(engine: Any, requests: Sequence[Any], sps: Sequence[Any], on_tokens: Callable[[list[int], list[int]], None],
            tag: str) -> list[Any]:
    """The finished ``RequestOutput`` of each of ``requests`` (with its ``sps``), run on vLLM's ``engine``
    (``LLM.llm_engine``); ``tag`` prefixes the request ids (unique per batch)."""
    from vllm.sampling_params import RequestOutputKind

    index: dict[str, int] = {}
    finished: list[Any] = [None] * len(requests)
    try:
        for i, (request, sp) in enumerate(zip(requests, sps)):
            sp.output_kind = RequestOutputKind.CUMULATIVE
            # Outputs (and aborts) name a request by the id given here; vLLM's own id adds a random suffix.
            index[f"{tag}-{i}"] = i
            engine.add_request(f"{tag}-{i}", request, sp)
        told = [0] * len(requests)
        while engine.has_unfinished_requests():
            rows: list[int] = []
            tokens: list[int] = []
            for out in engine.step():
                i = index[out.request_id]
                new = out.outputs[0].token_ids[told[i]:]
                told[i] += len(new)
                rows += [i] * len(new)
                tokens += [int(t) for t in new]
                if out.finished:
                    finished[i] = out
            if rows:
                on_tokens(rows, tokens)
    except BaseException:
        running = [rid for rid, i in index.items() if finished[i] is None]
        if running:
            engine.abort_request(running)
        raise
    return finished
