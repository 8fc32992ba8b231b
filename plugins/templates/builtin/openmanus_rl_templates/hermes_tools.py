"""``hermes_tools``: Hermes 2 Pro / Hermes 3 tool calls (NousResearch), as their ``tool_use`` chat template writes an
assistant's call::

    <tool_call>
    { "arguments": {"degrees": 3}, "name": "heat"}
    </tool_call>

Hermes models were trained on calls written as Python literals too (``{'arguments': {'degrees': 3}, 'name':
'heat'}``): a body that is not JSON is read with :func:`ast.literal_eval` (literals only, nothing is run).
"""

from __future__ import annotations

import ast
import json
from typing import Any, Mapping

from openmanus_rl_templates.tool_calls import ToolCallTemplate, tagged_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_LITERAL = 16_000
"""The longest body read as a Python literal (longer ones are invalid: bounds the work on adversarial text)."""


def _literal(body: str) -> Any:
    """A call body written as a Python literal, or None."""
    if len(body) > MAX_LITERAL:
        return None
    try:
        return ast.literal_eval(body.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


class HermesToolsTemplate(ToolCallTemplate):
    """Hermes (module docstring; the family's shared rules in :mod:`openmanus_rl_templates.tool_calls`).

    ``parse`` reads the first ``<tool_call>`` block: one JSON object then ``</tool_call>`` (or the end of the reply),
    or a Python-literal dict then ``</tool_call>``. ``render`` writes ``arguments`` before ``name``, as the Hermes
    template does. Generation stops at ``</tool_call>``; ``end_pattern`` ``</tool_call>\\s*$``.
    """

    family = "hermes_tools"
    stop = [CLOSE]
    end_pattern = r"</tool_call>\s*$"

    def locate(self, text: str) -> tuple[int, Any] | None:
        return tagged_call(text, OPEN, CLOSE, fallback=_literal)

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        args = json.dumps(dict(arguments), ensure_ascii=False)
        return f'{OPEN}\n{{ "arguments": {args}, "name": {json.dumps(name, ensure_ascii=False)}}}\n{CLOSE}'
