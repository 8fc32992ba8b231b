"""``react``: ``<think>reasoning</think><action>the action</action>``, the think block optional."""

from __future__ import annotations

import re

from openmanus_rl_core.protocols import ParsedAction

from openmanus_rl_core.protocols import as_text
from openmanus_rl_templates._common import invalid, system_prompt

_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


class ReactTemplate:
    """ReAct tags.

    ``parse`` reads the FIRST complete action block: it finds the first ``</action>`` after an
    ``<action>`` and takes the text after the nearest ``<action>`` before it (so
    ``"use <action> tags: <action>x</action>"`` gives ``x``); anything after that ``</action>`` is
    ignored, and so is a stray ``</action>`` before any ``<action>``. Tags match case-insensitively. No
    complete block, or an empty one, is invalid. ``thought`` is the first ``<think>`` block before
    the action (an unclosed ``<think>`` runs up to the action), else the text before the action.

    kwargs:
      ``think`` (True): whether the system prompt offers the think block (``parse`` reads one either way).
      ``action_tag`` / ``think_tag`` ("action" / "think"): the tag names.
      ``strip`` (True): strip whitespace around the action.
      ``system`` (None): a system prompt replacing the default; ``{instruction}`` is filled in.

    ``end_pattern`` ``</action>\\s*$`` (the action tag's name): a well-formed reply ends right after its action.
    """

    def __init__(self, think: bool = True, action_tag: str = "action", think_tag: str = "think",
                 strip: bool = True, system: str | None = None):
        for label, tag in (("action_tag", action_tag), ("think_tag", think_tag)):
            if not isinstance(tag, str) or not _TAG.fullmatch(tag):
                raise ValueError(f"{label}={tag!r} must be a tag name such as 'action' (letters, digits, _ . -)")
        if action_tag.lower() == think_tag.lower():
            raise ValueError(f"action_tag and think_tag are both {action_tag!r}: give them different names")
        self.think = bool(think)
        self.action_tag, self.think_tag = action_tag, think_tag
        self.strip = bool(strip)
        self.system = system
        self.stop = [f"</{action_tag}>"]
        self.end_pattern = re.escape(f"</{action_tag}>") + r"\s*$"  # a reply ends at its closing action tag
        self._open = re.compile(re.escape(f"<{action_tag}>"), re.IGNORECASE)
        self._close = re.compile(re.escape(f"</{action_tag}>"), re.IGNORECASE)
        self._think_open = re.compile(re.escape(f"<{think_tag}>"), re.IGNORECASE)
        self._think_close = re.compile(re.escape(f"</{think_tag}>"), re.IGNORECASE)

    def system_prompt(self, instruction: str) -> str:
        a, t = self.action_tag, self.think_tag
        line = f"Reply with <{a}>your action</{a}>."
        if self.think:
            line = f"Think in <{t}>...</{t}>, then reply with <{a}>your action</{a}>."
        return system_prompt(instruction, line, self.system)

    def parse(self, text: str) -> ParsedAction:
        text = as_text(text)
        first = self._open.search(text)
        close = self._close.search(text, first.end()) if first else None
        if first is None or close is None:
            return invalid(text, self._thought(text))
        opening = first
        for opening in self._open.finditer(text, first.end(), close.start()):
            pass
        content = text[opening.end(): close.start()]
        if self.strip:
            content = content.strip()
        thought = self._thought(text[: opening.start()])
        if not content.strip():
            return invalid(text, thought)
        return ParsedAction(kind="action", content=content, valid=True, thought=thought)

    def _thought(self, before: str) -> str:
        """The think block in ``before`` (the text ahead of the action), else all of it, stripped."""
        start = self._think_open.search(before)
        if start is None:
            return before.strip()
        end = self._think_close.search(before, start.end())
        return before[start.end(): end.start() if end else len(before)].strip()

    def render(self, action: str, thought: str = "") -> str:
        a, t = self.action_tag, self.think_tag
        body = f"<{a}>{action}</{a}>"
        return f"<{t}>{thought}</{t}>{body}" if thought else body
