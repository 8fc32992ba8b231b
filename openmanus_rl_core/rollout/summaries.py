"""Model-written summaries of a per-turn memory (the optional ``summary_*`` members of ``protocols.Memory``).

Before each generate call of the loop (lockstep: over every live episode; ``rollout.mode=episodes``: over the
episodes about to reply), :meth:`SummaryWriter.write` asks the memory, per episode, for a :class:`SummaryRequest`
(turns left the window since the summary was written). The requests' chats, rendered with the run's chat template
and cut to ``max_sample_tokens - budget`` tokens (their end kept), go to the writer engine in ONE batched
``generate`` with ``max_new_tokens = budget`` and no stop strings. The writer is the memory's own engine (a served
model) or, when it has none, the rollout's engine: the policy being trained.

Each reply becomes the episode's :class:`Summary`:

- a reply with no letter or digit (empty, whitespace, punctuation only) is unusable: the memory's
  ``summary_fallback(turns)`` (a rule-written summary) is kept instead, counted in ``info["summary_fallbacks"]``;
- the text is cut to the budget by tokens (``tokens[:budget]`` decoded, shortened until it re-encodes within the
  budget; ``info["summary_cut"]`` counts it), so no summary exceeds its budget, whatever the writer returns;
- ``info["summary_tokens"]`` lists each kept summary's length in the run's tokens.

The summary is part of the next context (a prompt: mask 0); the writing call's tokens are never in an episode's
response, so nothing is trained on them. An engine error while writing ends the rollout as a rollout engine's does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from openmanus_rl_core.protocols import Summary, SummaryRequest


def writes_summaries(memory: Any) -> bool:
    """Whether the loop must have ``memory``'s summaries written by a model."""
    return bool(memory is not None and memory.per_turn and getattr(memory, "summary_tokens", 0))


def usable(text: str) -> bool:
    """A writer's reply worth keeping: it holds at least one letter or digit."""
    return any(ch.isalnum() for ch in text)


class SummaryWriter:
    """Writes the summaries of one :class:`~.loop.AgentLoop`'s memory (see the module doc). ``seconds`` and
    ``calls`` count the time spent in, and the number of, writing ``generate`` calls."""

    def __init__(self, loop: Any):
        self.loop = loop
        self.memory = loop.memory
        self.budget = int(self.memory.summary_tokens)
        if self.budget >= loop.cfg.max_sample_tokens:
            raise ValueError(f"the memory's summary budget ({self.budget} tokens) leaves no room for the writer's "
                             f"prompt in rollout.max_sample_tokens={loop.cfg.max_sample_tokens}; lower the budget")
        self.engine = self.memory.summary_engine(loop.tokenizer)  # None: the rollout's engine (the policy)
        self.seconds = 0.0
        self.calls = 0

    def write(self, lives: Sequence[Any]) -> None:
        """Bring the summary of every episode in ``lives`` up to date (``live.summary``)."""
        loop, memory = self.loop, self.memory
        asks: list[tuple[Any, SummaryRequest]] = []
        for lv in lives:
            request = memory.summary_request(lv.system, lv.task, lv.history, lv.summary)
            if request is not None:
                asks.append((lv, request))
        if not asks:
            return
        limit = loop.cfg.max_sample_tokens - self.budget
        prompts = [self._prompt(request.messages, limit) for _, request in asks]
        params = dataclasses.replace(loop._params(), max_new_tokens=self.budget, stop=[])
        t0 = time.perf_counter()
        gens = (self.engine or loop.engine).generate(prompts, params)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        if len(gens) != len(asks):
            raise RuntimeError(f"the summary engine returned {len(gens)} generations for {len(asks)} prompts")
        for (lv, request), gen in zip(asks, gens):
            info = lv.ep.trajectory.info
            text = str(gen.text or "").strip()
            if not usable(text):
                text = memory.summary_fallback(lv.history[: request.turns])
                info["summary_fallbacks"] = info.get("summary_fallbacks", 0) + 1
            text, n, cut = self.fit(text)
            if cut:
                info["summary_cut"] = info.get("summary_cut", 0) + 1
            info.setdefault("summary_tokens", []).append(n)
            lv.summary = Summary(text=text, turns=request.turns)

    def fit(self, text: str) -> tuple[str, int, bool]:
        """``text`` cut to the budget: ``(text, its tokens, whether it was cut)``."""
        chat = self.loop.chat
        ids = chat.encode(text)
        if len(ids) <= self.budget:
            return text, len(ids), False
        for n in range(self.budget, 0, -1):
            # A decoded prefix may re-encode to more tokens (merges across the cut): shorten until it fits.
            short = self.loop.tokenizer.decode(ids[:n], skip_special_tokens=True).strip()
            m = len(chat.encode(short))
            if m <= self.budget:
                return short, m, True
        return "", 0, True

    def _prompt(self, messages: list[dict[str, str]], limit: int) -> list[int]:
        text = self.loop.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.loop.chat.encode(text)
        return ids[-limit:] if len(ids) > limit else ids
