"""Tool calls in a reply, for the gateway's OpenAI-shaped answer.

The model writes a call the way its chat template taught it; the Qwen2.5/Qwen3 and Hermes families write one JSON
object per call between ``<tool_call>`` and ``</tool_call>``::

    I will look it up.
    <tool_call>
    {"name": "search", "arguments": {"query": "ray"}}
    </tool_call>

:func:`parse_tool_calls` gives the text outside the calls and the calls in OpenAI's shape (``arguments`` as a JSON
string). A block that is not such an object stays in the text: the agent sees what the model wrote.
"""

from __future__ import annotations

import json
import re
import uuid

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """``(text without the parsed calls, [{"id", "type": "function", "function": {"name", "arguments"}}])``."""
    calls: list[dict] = []

    def take(match: re.Match) -> str:
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return match.group(0)
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
        return ""

    rest = _BLOCK.sub(take, text)
    return rest.strip(), calls
