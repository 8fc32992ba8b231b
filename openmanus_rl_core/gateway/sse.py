"""Server-sent events, the wire format of every streamed reply (chat chunks, Responses events, Messages events), and
how a reply streams while it is generated.

An engine that can (``streams_tokens``: ``hf``, ``vllm``) tells each decoding step's tokens to the gateway's batcher, which
hands each prompt's tokens to its own request's :class:`Feed`. The request's coroutine (:meth:`Live.events`) turns
them into text deltas: the reply so far is decoded as the finished reply will be (``reply_text``: special tokens
kept, the closing EOS left out) and only what follows the text already sent goes out, never a trailing U+FFFD (the
first bytes of a character whose last bytes are still to come).

What may go out live (the rule, per choice; the rest goes out at the end, with the finished reply's events):

- a request that offers tools (``tool_choice`` other than ``none``): nothing live. A tool parser must see the whole
  reply (a call may begin anywhere, and a reply with calls has its text stripped around them);
- the family's reasoning parser ``none``: the text, live;
- ``think``: nothing until ``</think>``; then the reasoning, whole, and the text after it, live (its leading
  newlines held until other text comes). A reply that never closes the block is all reasoning, sent at the end;
- any other reasoning parser (gpt-oss's harmony channels): nothing live. Each parser says this itself
  (``ReasoningParser.live``);
- held back in every case: the text from the first of the request's ``stop`` strings on, and an ending that could
  be the start of one (OpenAI leaves a stop string out of the reply).

So what went out live is always the start of the finished reply's content, and the finished events send the rest.
An engine that cannot stream (a served model) gets no tokens to tell; its stream sends a
``: keep-alive`` comment every ``Gateway.keepalive_s`` seconds until the reply is finished, as does any stream while
no token comes (the request waits for its batch or for the engine's lock). Log-probs go out with the last delta.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, AsyncIterator

from openmanus_rl_core.gateway.reasoning import ReasoningParser

KEEPALIVE = b": keep-alive\n\n"


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``data`` as JSON (or as given, when a string)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


class Feed:
    """The token ids of one request's choices as the engine produces them: :meth:`add` and :meth:`wake` from the
    engine's thread (once per step, however many tokens), :meth:`wait` on the request's event loop."""

    def __init__(self, choices: int):
        self.ids: list[list[int]] = [[] for _ in range(choices)]
        self.done = False
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._flagged = False  # a wake is on its way to the loop: later ones need not send another
        self._lock = threading.Lock()

    def add(self, choice: int, token: int) -> None:
        self.ids[choice].append(int(token))  # one list append: atomic, the loop reads a prefix

    def wake(self) -> None:
        with self._lock:
            if self._flagged:
                return
            self._flagged = True
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop is gone (the gateway closed): nobody is reading
            pass

    @staticmethod
    def tell(owners: list, rows: list[int], tokens: list[int]) -> None:
        """One decoding step's ``tokens`` (of batch rows ``rows``) to the feeds that stream them: ``owners[row]``
        is ``(feed, choice)`` or None. One wake per feed."""
        woken: list[Feed] = []
        for i, token in zip(rows, tokens):
            owner = owners[i]
            if owner is not None:
                owner[0].add(owner[1], token)
                if owner[0] not in woken:
                    woken.append(owner[0])
        for feed in woken:
            feed.wake()

    def close(self) -> None:
        """No more tokens come (the generate call ended, or failed)."""
        self.done = True
        self.wake()

    async def wait(self, timeout: float) -> bool:
        """Whether something came (tokens or the end) within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return False
        with self._lock:
            self._flagged = False
            self._event.clear()
        return True


class LiveText:
    """One choice's text as it may go out live (the rule in the module doc). ``advance(text)`` with the reply so far
    gives what is new: ``("reasoning", whole reasoning)`` once, ``("content", delta)``."""

    def __init__(self, reasoning: ReasoningParser, hold_all: bool, stops: list[str]):
        self.reasoning, self.hold_all, self.stops = reasoning, hold_all, [s for s in stops if s]
        self.sent = ""  # the content sent so far
        self.thought: str | None = None  # the reasoning, once sent

    def _visible(self, text: str) -> str:
        """``text`` without what a stop string may still take out, nor a trailing partial character."""
        cut = len(text)
        for s in self.stops:  # its first whole occurrence, or an ending that may become one
            found = text.find(s)
            if found < 0:
                found = next((len(text) - k for k in range(min(len(s) - 1, len(text)), 0, -1)
                              if text.endswith(s[:k])), len(text))
            cut = min(cut, found)
        return text[:cut].rstrip("\ufffd")

    def advance(self, text: str) -> list[tuple[str, str]]:
        live = None if self.hold_all else self.reasoning.live(self._visible(text))
        if live is None:
            return []
        thought, visible = live
        out = []
        if thought is not None and self.thought is None:
            self.thought = thought
            out.append(("reasoning", thought))
        if len(visible) > len(self.sent) and visible.startswith(self.sent):
            out.append(("content", visible[len(self.sent):]))
            self.sent = visible
        return out

    @property
    def went_live(self) -> bool:
        return bool(self.sent) or self.thought is not None

    def rest(self, content: str) -> str:
        """What of the finished ``content`` is still to send (all of it if the live part was not its start, which
        the rule rules out)."""
        return content[len(self.sent):] if content.startswith(self.sent) else content


class Live:
    """One streamed request while it is generated: ``events()`` yields ``None`` for a keep-alive, or ``(choice,
    kind, text)`` (:class:`LiveText`); ``await result()`` is the finished
    :class:`~openmanus_rl_core.gateway.server.Generated` (the engine's error, if it failed)."""

    def __init__(self, feed: Feed, task: asyncio.Future, texts: list[LiveText], decode: Any, prompt_tokens: int,
                 keepalive_s: float):
        self.feed, self.task, self.texts, self.decode = feed, task, texts, decode
        self.prompt_tokens, self.keepalive_s = prompt_tokens, keepalive_s

    async def events(self) -> AsyncIterator[tuple[int, str, str] | None]:
        seen = [0] * len(self.texts)
        done = False
        while not done:
            if not await self.feed.wait(self.keepalive_s):
                yield None
                continue
            done = self.feed.done  # read before the ids: a closed feed's ids are all there
            for choice, text in enumerate(self.texts):
                ids = self.feed.ids[choice]
                if len(ids) == seen[choice] or text.hold_all:
                    continue
                seen[choice] = len(ids)
                for kind, delta in text.advance(self.decode(ids[:seen[choice]])):
                    yield choice, kind, delta

    async def result(self) -> Any:
        return await asyncio.shield(self.task)
