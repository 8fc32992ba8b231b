"""Tools on their way to the model (:class:`ChatRenderer`) and calls on their way back (:func:`parse_tool_calls`).

**Tools always reach the model.** A request's ``tools`` go to the chat template (``apply_chat_template(...,
tools=...)``). A template that renders no tools (found once: a conversation rendered with a tool and without it
gives the same text) would drop them without a word, so they go into the system prompt instead, in the model
family's call format (:meth:`~openmanus_rl_core.gateway.parsers.ToolParser.tool_prompt`), and the gateway says so
once. Tool calls in the conversation's assistant messages reach the template with their arguments as a mapping
(most templates) or, for a template that only takes them as OpenAI's JSON string (DeepSeek's), as that string.

**Calls back.** The model writes a call the way its chat template taught it; the family's
:class:`~openmanus_rl_core.gateway.parsers.ToolParser` reads it (``parsers.py``). :func:`parse_tool_calls` is the
Hermes/Qwen one (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), the embedded default's format.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any, Callable, Sequence

from openmanus_rl_core.gateway.parsers import ToolParser, tool_parser_for
from openmanus_rl_core.gateway.reasoning import ReasoningParser, reasoning_parser_for

log = logging.getLogger(__name__)


def reply_text(tokenizer: Any, completion_ids: Sequence[int]) -> str:
    """A reply's text for the parsers: decoded with its special tokens (the markers of some families' calls are
    special tokens), without the end-of-turn token that closed it."""
    ids = list(completion_ids)
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids.pop()
    return tokenizer.decode(ids, skip_special_tokens=False)


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """``(text without the parsed calls, [{"id", "type": "function", "function": {"name", "arguments"}}])`` in the
    Hermes/Qwen format; a block that is not a call stays in the text."""
    return tool_parser_for("hermes").parse(text)


_PROBE = "OMRLprobeTool"


class ChatRenderer:
    """A conversation as the prompt the model sees, for one tokenizer (see the module doc).

    ``text(messages, tools, add_generation_prompt=True)`` -> the prompt's text; ``ids(...)`` -> its token ids.
    ``tool_parser`` / ``reasoning_parser``: the model family's (``agent.tool_parser`` / ``agent.reasoning_parser``
    names, None: found from the chat template). ``notice``: how the one line about tools going into the system
    prompt is told (default: this module's logger, as a warning).
    """

    def __init__(self, tokenizer: Any, tool_parser: str | ToolParser | None = None,
                 reasoning_parser: str | ReasoningParser | None = None,
                 notice: Callable[[str], None] | None = None):
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser if isinstance(tool_parser, ToolParser) else tool_parser_for(tool_parser,
                                                                                                    tokenizer)
        self.reasoning_parser = (reasoning_parser if isinstance(reasoning_parser, ReasoningParser)
                                 else reasoning_parser_for(reasoning_parser, tokenizer))
        self.notice = notice or log.warning
        self._renders_tools: bool | None = None
        self._string_arguments: bool | None = None
        self._told = False

    @classmethod
    def for_agent(cls, tokenizer: Any, agent_cfg: Any, notice: Callable[[str], None] | None = None) -> "ChatRenderer":
        """The renderer of a run's gateway: the parsers ``agent.tool_parser`` and ``agent.reasoning_parser`` name."""
        return cls(tokenizer, agent_cfg.tool_parser, agent_cfg.reasoning_parser, notice)

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template writes the tools it is given (a probe tool changes the rendered text)."""
        if self._renders_tools is None:
            probe = [{"type": "function", "function": {"name": _PROBE, "description": "",
                                                       "parameters": {"type": "object", "properties": {}}}}]
            chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
            try:
                self._renders_tools = self._apply(chat, probe, True) != self._apply(chat, None, True)
            except Exception:  # noqa: BLE001  (a template that fails on tools does not render them)
                self._renders_tools = False
        return self._renders_tools

    def text(self, messages: list[dict], tools: list | None = None, add_generation_prompt: bool = True) -> str:
        """The conversation's text as the chat template renders it, the tools reaching the model either way."""
        messages = [dict(m) for m in messages]
        if tools and not self.renders_tools:
            messages = self.tools_in_system_prompt(messages, tools)
            tools = None
        if self._wants_string_arguments(messages):
            messages = _string_arguments(messages)
        return self._apply(messages, tools or None, add_generation_prompt)

    def ids(self, messages: list[dict], tools: list | None = None, add_generation_prompt: bool = True) -> list[int]:
        return list(self.tokenizer.encode(self.text(messages, tools, add_generation_prompt),
                                          add_special_tokens=False))

    def tools_in_system_prompt(self, messages: list[dict], tools: list) -> list[dict]:
        """``messages`` with the tools (and the family's call format) after the system prompt, or as the first
        message when there is none; says once that it happened."""
        if not self._told:
            self._told = True
            self.notice(f"the model's chat template does not render tools: the request's tools go into the system "
                        f"prompt in the {self.tool_parser.name} call format (told once)")
        prompt = self.tool_parser.tool_prompt([dict(t) for t in tools])
        if messages and messages[0].get("role") == "system":
            first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{prompt}".lstrip())
            return [first] + messages[1:]
        return [{"role": "system", "content": prompt}] + messages

    def _apply(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def _wants_string_arguments(self, messages: list[dict]) -> bool:
        """Whether this template takes a call's arguments only as a JSON string (it fails on a mapping); found on
        the first conversation with a call."""
        if self._string_arguments is None:
            if not any(m.get("tool_calls") for m in messages):
                return False
            try:
                self._apply(messages, None, False)
                self._string_arguments = False
            except Exception:  # noqa: BLE001
                try:
                    self._apply(_string_arguments(messages), None, False)
                except Exception:  # noqa: BLE001  (fails either way: not the arguments; the caller sees why)
                    return False
                self._string_arguments = True
        return self._string_arguments


def _string_arguments(messages: list[dict]) -> list[dict]:
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            if not isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.dumps(fn.get("arguments", {}), ensure_ascii=False)
    return out
