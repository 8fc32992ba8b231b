"""``json_tool``: a JSON tool call ``{"name": "act", "arguments": {"action": "..."}}``."""

from __future__ import annotations

import json
import re
from typing import Any

from openmanus_rl_core.protocols import ParsedAction

from openmanus_rl_core.protocols import as_text
from openmanus_rl_templates._common import invalid, system_prompt
from openmanus_rl_templates.tool_calls import call_parts

MAX_CANDIDATES = 64
"""How many ``{`` positions ``parse`` tries before giving up: bounds the work on adversarial text
(each failed decode may scan to the end of the reply)."""

_DECODER = json.JSONDecoder()
_WRAPPER_START = re.compile(r"<tool_call>|```", re.IGNORECASE)


class JsonToolTemplate:
    """A JSON tool call, optionally wrapped in ``<tool_call>...</tool_call>`` or a ```` ```json ```` fence.

    ``parse`` is tolerant: it takes the first ``{`` at which a whole JSON object decodes (so prose
    with stray braces before the call, fences, tags and text after the call are all fine; nested
    braces inside the object are part of it). That object must have ``"name"`` equal to
    ``tool_name`` and ``"arguments"`` (or ``"parameters"``) holding ``arg_name``; ``arguments`` may
    also be a JSON-encoded string, OpenAI style. The action is that argument's value (a string, or a
    number written as JSON writes it). Bad JSON, no object, another tool's name, missing or empty
    fields: invalid. ``thought`` is the text before the call (before ``<tool_call>`` / the fence).

    kwargs:
      ``tool_name`` ("act"), ``arg_name`` ("action"): the call's names.
      ``tags`` (True): ``render`` wraps the call in ``<tool_call>`` tags and ``stop`` is
      ``["</tool_call>"]``; with False the call is bare JSON and there is no stop string.
      ``strip`` (False): strip whitespace around the action (JSON strings say exactly what they mean).
      ``system`` (None): a system prompt replacing the default; ``{instruction}`` is filled in.

    ``end_pattern``: a well-formed reply ends with the call, ``</tool_call>\\s*$`` (with ``tags``) or ``\\}\\s*$``.
    """

    def __init__(self, tool_name: str = "act", arg_name: str = "action", tags: bool = True,
                 strip: bool = False, system: str | None = None):
        for label, value in (("tool_name", tool_name), ("arg_name", arg_name)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{label}={value!r} must be a non-empty string")
        self.tool_name, self.arg_name = tool_name, arg_name
        self.tags = bool(tags)
        self.strip = bool(strip)
        self.system = system
        self.stop = ["</tool_call>"] if self.tags else []
        self.end_pattern = r"</tool_call>\s*$" if self.tags else r"\}\s*$"  # nothing after the call

    def system_prompt(self, instruction: str) -> str:
        return system_prompt(instruction, "Act with a tool call: " + self.render("..."), self.system)

    def parse(self, text: str) -> ParsedAction:
        text = as_text(text)
        found = _first_object(text)
        if found is None:
            return invalid(text)
        obj, start = found
        before = text[:start]
        wrapper = _WRAPPER_START.search(before)
        thought = (before[: wrapper.start()] if wrapper else before).strip()
        action = self._action(obj)
        if action is None:
            return invalid(text, thought)
        return ParsedAction(kind="tool_call", content=action, valid=True, thought=thought)

    def _action(self, obj: dict[str, Any]) -> str | None:
        """The call's action, or None when the object is not a well-formed call of this tool."""
        parts = call_parts(obj)
        if parts is None or parts[0] != self.tool_name:
            return None
        value = parts[1].get(self.arg_name)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return None
        action = value if isinstance(value, str) else json.dumps(value)
        if self.strip:
            action = action.strip()
        return action if action.strip() else None

    def render(self, action: str, thought: str = "") -> str:
        call = json.dumps({"name": self.tool_name, "arguments": {self.arg_name: action}}, ensure_ascii=False)
        if self.tags:
            call = f"<tool_call>{call}</tool_call>"
        return f"{thought}\n{call}" if thought else call


def _first_object(text: str) -> tuple[dict[str, Any], int] | None:
    """The first JSON object that decodes at some ``{`` of ``text``, and where it starts."""
    pos = text.find("{")
    tries = 0
    while pos != -1 and tries < MAX_CANDIDATES:
        tries += 1
        try:
            obj, _ = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            pos = text.find("{", pos + 1)
            continue
        return obj, pos  # raw_decode at a "{" yields a dict or nothing
    return None
