"""Helpers shared by the templates."""

from __future__ import annotations

from typing import Any

from openmanus_rl_core.protocols import ParsedAction


def to_text(text: Any) -> str:
    """Whatever the engine handed over, as a str (bytes decoded leniently); never raises."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    try:
        return "" if text is None else str(text)
    except Exception:
        return ""


def invalid(text: str, thought: str = "") -> ParsedAction:
    """An unreadable reply: the raw text goes on to the env, which answers it as an unknown action."""
    return ParsedAction(kind="invalid", content=text, valid=False, thought=thought)


def system_prompt(instruction: str, format_line: str, system: str | None) -> str:
    """``system`` with ``{instruction}`` replaced, or the instruction then the format line.

    ``str.replace`` rather than ``str.format``: JSON examples in a prompt carry braces of their own.
    """
    instruction = to_text(instruction).strip()
    if system is not None:
        return system.replace("{instruction}", instruction)
    return f"{instruction}\n{format_line}" if instruction else format_line
