"""Helpers shared by the templates."""

from __future__ import annotations


from openmanus_rl_core.protocols import ParsedAction, as_text

def invalid(text: str, thought: str = "") -> ParsedAction:
    """An unreadable reply: the raw text goes on to the env, which answers it as an unknown action."""
    return ParsedAction(kind="invalid", content=text, valid=False, thought=thought)


def system_prompt(instruction: str, format_line: str, system: str | None) -> str:
    """``system`` with ``{instruction}`` replaced, or the instruction then the format line.

    ``str.replace`` rather than ``str.format``: JSON examples in a prompt carry braces of their own.
    """
    instruction = as_text(instruction).strip()
    if system is not None:
        return system.replace("{instruction}", instruction)
    return f"{instruction}\n{format_line}" if instruction else format_line
