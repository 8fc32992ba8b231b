"""The tool-calling template family: the env's tools reach the model through its chat template, and the model's call,
written in its family's own format, reaches ``Env.step`` as one canonical text.

**The canonical call text** (what ``Env.step`` receives for a call)::

    {"name": "heat", "arguments": {"degrees": 3}}

exactly ``json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)``: ``name`` first, ``arguments``
an object (``{}`` for a call without arguments) whose keys keep the model's order, JSON's default separators
(``", "`` and ``": "``), non-ASCII characters as they are. :func:`canonical` writes it and :func:`read_canonical`
reads it back; an env reads it with ``json.loads``.

**A family is a subclass** of :class:`ToolCallTemplate` that says where a call sits in a reply (:meth:`locate`) and
how the family writes one (:meth:`write`); everything else (the canonical text, what is invalid, ``text_tool``, the
system prompt) is shared. Each family is its own entry point in ``openmanus_rl.templates``.

**Invalid** (``kind="invalid"``, the raw reply as ``content``, never an exception): no call; a call whose body is not
an object (bad JSON, or for Hermes a bad Python literal); a ``name`` that is missing, empty or not a string;
``arguments`` that are not an object (a JSON text of an object counts as one, OpenAI style); text between the object
and the closing tag; with ``text_tool``, a call of that tool without a non-empty string ``action`` or with other
arguments.

**``text_tool``** (e.g. ``act``): for an env whose actions are text (every built-in env), the template offers one
tool ``act(action: str)`` itself (``tools``) and hands such a call's ``action`` to the env as text; the env's own
``tools``, when it has them, come first (``openmanus_rl_core.rollout.chat.prompt_tools``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping

from openmanus_rl_core.protocols import ParsedAction, as_text

from openmanus_rl_templates._common import invalid

__all__ = ["ToolCallTemplate", "canonical", "read_canonical", "call_parts", "decode_object", "tagged_call",
           "TEXT_ARG"]

TEXT_ARG = "action"
"""The one argument of the ``text_tool``."""

MAX_CANDIDATES = 64
"""How many ``{`` positions a search for a JSON object tries (bounds the work on adversarial text)."""

_DECODER = json.JSONDecoder()
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)


def canonical(name: str, arguments: Mapping[str, Any]) -> str:
    """The canonical call text (module docstring)."""
    return json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)


def call_parts(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of a decoded call object, or None when it is not one: ``name`` a non-empty string,
    ``arguments`` (or Llama's ``parameters``) an object, or a JSON text of one; absent: no arguments."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return name, args


def read_canonical(text: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of a canonical call text (any JSON object with those two keys), else None."""
    try:
        obj = json.loads(as_text(text))
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments"} or not isinstance(obj.get("arguments", {}), dict):
        return None
    return call_parts(obj)


def decode_object(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value that starts at ``text[pos]`` (after whitespace) and where it ends, or None."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None


def tagged_call(text: str, open_tag: str, close_tag: str,
                fallback: Callable[[str], Any] | None = None) -> tuple[int, Any] | None:
    """The first call between ``open_tag`` and ``close_tag``: ``(where open_tag starts, its object)``; the object is
    None when the body is not one JSON value followed by the closing tag (or by the end of the reply: a model that
    ended its turn right after the object). ``fallback(body)`` decodes a body that is not JSON (the text up to the
    closing tag, which it then needs); None when the reply has no ``open_tag``."""
    start = text.find(open_tag)
    if start < 0:
        return None
    body = start + len(open_tag)
    found = decode_object(text, body)
    if found is not None:
        tail = text[found[1]:].lstrip()
        return start, (found[0] if not tail or tail.startswith(close_tag) else None)
    close = text.find(close_tag, body)
    if fallback is None or close < 0:
        return start, None
    return start, fallback(text[body:close])


def _thought(before: str) -> str:
    """The reasoning ahead of a call: a ``<think>`` block's text (Qwen3), else all of it, stripped."""
    block = _THINK.search(before)
    return (block.group(1) if block else before).strip()


class ToolCallTemplate:
    """The shared part of a tool-calling family (module docstring). Subclasses set ``family``, ``stop`` and
    ``end_pattern`` and implement :meth:`locate` and :meth:`write`.

    kwargs:
      ``text_tool`` (None): the name of a one-argument tool ``<text_tool>(action: str)`` the template offers for an
      env whose actions are text; a call of it reaches the env as its ``action`` text.
      ``system`` (None): a system prompt replacing the default (the instruction alone); ``{instruction}`` is filled
      in. The tools and the family's call format come from the model's chat template.
    """

    family = ""
    calls_tools = True
    stop: list[str] = []
    end_pattern: str | None = None

    def __init__(self, text_tool: str | None = None, system: str | None = None):
        if text_tool is not None and (not isinstance(text_tool, str) or not _NAME.fullmatch(text_tool)):
            raise ValueError(f"text_tool={text_tool!r}: must be a tool name such as 'act' (letters, digits, _ . -)")
        self.text_tool = text_tool
        self.system = system
        self.stop = list(type(self).stop)
        self.tools = None if text_tool is None else [{"type": "function", "function": {
            "name": text_tool, "description": "Take one action in the environment.",
            "parameters": {"type": "object", "properties": {TEXT_ARG: {
                "type": "string", "description": "the action, written as the task describes"}},
                "required": [TEXT_ARG]}}}]

    # ---------------------------------------------------------------------------------- a family's part
    def locate(self, text: str) -> tuple[int, Any] | None:
        """Where the first call starts in ``text`` and its decoded object (None when its body is malformed); None
        when the reply has no call."""
        raise NotImplementedError

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The call as the family's chat template writes an assistant's tool call."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ the protocol
    def system_prompt(self, instruction: str) -> str:
        """The instruction alone (or ``system`` with it filled in): the chat template adds the tools and the format."""
        instruction = as_text(instruction).strip()
        return instruction if self.system is None else self.system.replace("{instruction}", instruction)

    def tool_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The tools and the call format as system-prompt text, for a chat template that does not write tools."""
        lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        first = tools[0].get("function", tools[0]) if tools else {}
        example = self.write(str(first.get("name", "tool")), {p: "..." for p in (
            first.get("parameters") or {}).get("properties", {})})
        return f"# Tools\n<tools>\n{lines}\n</tools>\nCall one tool per reply, as:\n{example}"

    def parse(self, text: str) -> ParsedAction:
        text = as_text(text)
        found = self.locate(text)
        if found is None:
            return invalid(text, _thought(text))
        start, obj = found
        thought = _thought(text[:start])
        call = call_parts(obj)
        if call is None:
            return invalid(text, thought)
        name, args = call
        if self.text_tool is not None and name == self.text_tool:
            action = args.get(TEXT_ARG)
            if set(args) != {TEXT_ARG} or not isinstance(action, str) or not action.strip():
                return invalid(text, thought)
            return ParsedAction(kind="tool_call", content=action, valid=True, thought=thought)
        return ParsedAction(kind="tool_call", content=canonical(name, args), valid=True, thought=thought)

    def render(self, action: str, thought: str = "") -> str:
        """A reply that calls ``action``: with ``text_tool``, that tool with ``action`` as its text; else
        ``action`` must be a canonical call text (``ValueError`` otherwise)."""
        if self.text_tool is not None:
            name, args = self.text_tool, {TEXT_ARG: action}
        else:
            call = read_canonical(action)
            if call is None:
                raise ValueError(f"{self.family} template: {action!r:.100} is not a canonical call text "
                                 f'{{"name": ..., "arguments": {{...}}}}; set text_tool to send text actions as a call')
            name, args = call
        body = self.write(name, args)
        return f"{thought}\n{body}" if thought else body
