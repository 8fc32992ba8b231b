"""``qwen_tools``: Qwen2.5's and Qwen3's tool calls, as their chat templates write an assistant's call::

    <tool_call>
    {"name": "heat", "arguments": {"degrees": 3}}
    </tool_call>

Qwen3 may think first (``<think>...</think>``): that block is the ``thought``.
"""

from __future__ import annotations

from typing import Any, Mapping

from openmanus_rl_templates.tool_calls import ToolCallTemplate, canonical, tagged_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class QwenToolsTemplate(ToolCallTemplate):
    """Qwen2.5 / Qwen3 (module docstring; the family's shared rules in :mod:`openmanus_rl_templates.tool_calls`).

    ``parse`` reads the first ``<tool_call>`` block: one JSON object, then ``</tool_call>`` (or the end of the reply).
    Generation stops at ``</tool_call>``, so a reply holds one call; ``end_pattern`` ``</tool_call>\\s*$``.
    """

    family = "qwen_tools"
    stop = [CLOSE]
    end_pattern = r"</tool_call>\s*$"

    def locate(self, text: str) -> tuple[int, Any] | None:
        return tagged_call(text, OPEN, CLOSE)

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        return f"{OPEN}\n{canonical(name, arguments)}\n{CLOSE}"
