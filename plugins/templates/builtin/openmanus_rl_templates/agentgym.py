"""``agentgym``: AgentGym's ``Thought: ...`` / ``Action: ...`` replies."""

from __future__ import annotations

import re
from typing import Sequence

from openmanus_rl_core.protocols import ParsedAction

from openmanus_rl_core.protocols import as_text
from openmanus_rl_templates._common import invalid, system_prompt

_ACTION_AT_LINE_START = re.compile(r"^[ \t]*action[ \t]*:", re.IGNORECASE | re.MULTILINE)
_ACTION_ANYWHERE = re.compile(r"\baction[ \t]*:", re.IGNORECASE)
_THOUGHT = re.compile(r"^[ \t]*thought[ \t]*:", re.IGNORECASE | re.MULTILINE)


class AgentGymTemplate:
    """AgentGym's format::

        Thought: I should open the box first.
        Action: open box

    or, as several AgentGym envs prompt for, the action on the line after ``Action:``.

    ``parse`` uses the first ``Action:`` that starts a line (falling back to the first anywhere;
    case-insensitive). The action is the rest of that line, or the next non-blank line when the rest
    is blank; later lines (a hallucinated ``Observation:``) are ignored. With ``multiline`` the action
    is instead everything after ``Action:`` (for actions that span lines, e.g. SQL). ``thought`` is the
    text after ``Thought:`` (or all the text) before the action. No ``Action:`` or an empty action is
    invalid.

    kwargs:
      ``action_on_new_line`` (False): ``render`` puts the action on the line after ``Action:``.
      ``multiline`` (False): see above.
      ``strip`` (True): strip whitespace around the action (always on unless ``multiline``).
      ``stop`` (``["\\nObservation:"]``): stop strings, so a model that goes on to invent the env's
      answer is cut off.
      ``system`` (None): a system prompt replacing the default; ``{instruction}`` is filled in.

    ``end_pattern``: a well-formed reply ends with its action line, then at most a stop string
    (``Action: x\\nObservation:``); None with ``multiline``.
    """

    def __init__(self, action_on_new_line: bool = False, multiline: bool = False, strip: bool = True,
                 stop: Sequence[str] | None = None, system: str | None = None):
        self.action_on_new_line = bool(action_on_new_line)
        self.multiline = bool(multiline)
        self.strip = bool(strip) or not self.multiline
        self.stop = list(["\nObservation:"] if stop is None else stop)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop={stop!r} must be a list of non-empty strings")
        self.system = system
        # A well-formed reply ends with its action line (the action on the next line after a bare "Action:"),
        # then at most a stop string; a multiline action may end anywhere.
        stops = "|".join(re.escape(s) for s in self.stop)
        self.end_pattern = None if self.multiline else (
            r"(?i:action)[ \t]*:(?:\s*\n)?[^\n]*" + (f"(?:{stops})?" if stops else "") + r"\s*$")

    def system_prompt(self, instruction: str) -> str:
        sep = "\n" if self.action_on_new_line else " "
        return system_prompt(instruction, f"Reply as:\nThought: your reasoning\nAction:{sep}your action", self.system)

    def parse(self, text: str) -> ParsedAction:
        text = as_text(text)
        marker = _ACTION_AT_LINE_START.search(text) or _ACTION_ANYWHERE.search(text)
        if marker is None:
            return invalid(text, self._thought(text))
        thought = self._thought(text[: marker.start()])
        rest = text[marker.end():]
        if self.multiline:
            # without strip, drop only the one separator render puts after "Action:"
            content = rest.strip() if self.strip else (rest[1:] if rest[:1] in (" ", "\n") else rest)
        else:
            # a "line" is what str.splitlines() says (\r, \x1c, \u2028... end one too)
            content = next((line.strip() for line in rest.splitlines() if line.strip()), "")
        if not content.strip():
            return invalid(text, thought)
        return ParsedAction(kind="action", content=content, valid=True, thought=thought)

    @staticmethod
    def _thought(before: str) -> str:
        m = _THOUGHT.search(before)
        return (before[m.end():] if m else before).strip()

    def render(self, action: str, thought: str = "") -> str:
        sep = "\n" if self.action_on_new_line else " "
        body = f"Action:{sep}{action}"
        return f"Thought: {thought}\n{body}" if thought else body
