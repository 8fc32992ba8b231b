"""Reasoning in a reply, in the format of the model's family: a :class:`ReasoningParser` splits it out
(``split(text) -> (reasoning, content)``), chosen by name (``agent.reasoning_parser``) or, when unset, found from the
chat template's text (:func:`reasoning_parser_for`). The gateway gives it back as ``reasoning_content`` (chat),
a reasoning item (Responses) or a thinking block (Messages), never inside the content.

Reasoning parsers (:data:`REASONING_PARSERS`): ``think`` (``<think>...</think>`` before the answer: Qwen3,
DeepSeek-R1, QwQ; also when the prompt opened the block and the reply starts inside it), ``harmony`` (gpt-oss's
``analysis`` channel), ``none``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openmanus_rl_core.gateway.parsers import _choose, _harmony_messages, _template

__all__ = ["ReasoningParser", "REASONING_PARSERS", "reasoning_parser_for", "detect_reasoning_parser"]


class ReasoningParser:
    """``split(text) -> (reasoning or None, content)``: a reply's reasoning apart from what it answers."""

    name = ""

    def split(self, text: str) -> tuple[str | None, str]:
        return None, text

    def live(self, text: str) -> tuple[str | None, str] | None:
        """What of ``text``, a reply still being generated, may go out now, as ``split`` reads it: ``(reasoning or
        None, the content so far)``; None while nothing may (the reasoning can still change where it ends). Here:
        nothing until the reply is whole."""
        return None


class ThinkParser(ReasoningParser):
    """``<think>...</think>`` before the answer. A reply with ``</think>`` but no ``<think>`` began inside the
    block (the prompt opened it: DeepSeek-R1, Qwen3 with thinking forced); one with ``<think>`` and no end was cut
    while thinking: all reasoning."""

    name = "think"

    def split(self, text: str) -> tuple[str | None, str]:
        if "</think>" in text:
            thought, _, content = text.partition("</think>")
            return thought.split("<think>", 1)[-1].strip("\n"), content.lstrip("\n")
        if text.lstrip().startswith("<think>"):
            return text.lstrip()[len("<think>"):].strip("\n"), ""
        return None, text

    def live(self, text: str) -> tuple[str | None, str] | None:
        """Once the block has closed: the whole reasoning, then the answer as it grows. Before that, nothing: a
        reply without ``<think>`` may still close a block the prompt opened."""
        return self.split(text) if "</think>" in text else None


class HarmonyReasoning(ReasoningParser):
    """gpt-oss's ``analysis`` channel is its reasoning; the other messages stay for the tool parser."""

    name = "harmony"

    def split(self, text: str) -> tuple[str | None, str]:
        messages = _harmony_messages(text)
        if messages is None:
            return None, text
        thought = [body for channel, body, _, _ in messages if channel == "analysis"]
        rest = "".join(raw for channel, _, _, raw in messages if channel != "analysis")
        return ("\n".join(thought) if thought else None), rest


class NoReasoning(ReasoningParser):
    name = "none"

    def live(self, text: str) -> tuple[str | None, str] | None:
        return None, text


REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    p.name: p for p in (ThinkParser, HarmonyReasoning, NoReasoning)}
"""Reasoning parsers by name (``agent.reasoning_parser``)."""

_REASONING_MARKS: list[tuple[Callable[[str], bool], str]] = [
    (lambda t: "<|channel|>" in t, "harmony"),
    (lambda t: "</think>" in t, "think"),
]


def detect_reasoning_parser(tokenizer: Any) -> str:
    """The reasoning parser a tokenizer's chat template calls for (``none`` when it knows no reasoning)."""
    text = _template(tokenizer)
    return next((name for test, name in _REASONING_MARKS if test(text)), NoReasoning.name)


def reasoning_parser_for(name: str | None, tokenizer: Any = None) -> ReasoningParser:
    """The reasoning parser ``name`` names (``agent.reasoning_parser``), or, for None, the one the tokenizer's chat
    template calls for."""
    return _choose("reasoning_parser", name, REASONING_PARSERS, detect_reasoning_parser, tokenizer)
