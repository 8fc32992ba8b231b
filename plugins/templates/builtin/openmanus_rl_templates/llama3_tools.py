"""``llama3_tools``: Llama 3.1 / 3.2 / 3.3 JSON tool calls, as their chat template writes an assistant's call::

    {"name": "heat", "parameters": {"degrees": 3}}

optionally after ``<|python_tag|>`` (the token Llama writes before code and built-in tool calls). The reply ends with
the model's end-of-turn token, so there is no stop string.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from openmanus_rl_templates.tool_calls import MAX_CANDIDATES, ToolCallTemplate, decode_object

PYTHON_TAG = "<|python_tag|>"


class Llama3ToolsTemplate(ToolCallTemplate):
    """Llama 3.x JSON calls (module docstring; the family's shared rules in :mod:`openmanus_rl_templates.tool_calls`).

    ``parse`` takes the first JSON object in the reply that has a ``"name"`` (prose before it is the thought, a
    ``<|python_tag|>`` right before it is dropped; text after it, such as a second call, is ignored): its
    ``parameters`` (or ``arguments``) are the call's arguments. ``end_pattern``: the reply ends with the object,
    then at most an end-of-turn token.
    """

    family = "llama3_tools"
    stop: list[str] = []
    end_pattern = r"\}\s*(?:<\|eo[tm]_id\|>)?\s*$"

    def locate(self, text: str) -> tuple[int, Any] | None:
        pos, tries = text.find("{"), 0
        while pos != -1 and tries < MAX_CANDIDATES:
            tries += 1
            found = decode_object(text, pos)
            if found is not None and isinstance(found[0], dict) and "name" in found[0]:
                tag = text.rfind(PYTHON_TAG, 0, pos)
                start = tag if tag != -1 and not text[tag + len(PYTHON_TAG):pos].strip() else pos
                return start, found[0]
            pos = text.find("{", pos + 1)
        return None

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": dict(arguments)}, ensure_ascii=False)
