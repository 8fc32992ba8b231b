"""``message``: the whole reply is the action, in whatever format it comes (an agent's framework writes its own)."""

from __future__ import annotations

from openmanus_rl_core.protocols import ParsedAction, as_text
from openmanus_rl_templates._common import invalid, system_prompt


class MessageTemplate:
    """Every reply as it is: ``parse`` gives the whole reply, stripped, as a valid ``message``; only an empty reply is
    invalid. No stop string (a reply ends at the model's end of turn) and no ``end_pattern``.

    An agent behind the gateway (``agent.command`` / ``agent.function``) takes this template unless ``template=`` is
    given: its replies are in its framework's format (free text, tool calls, JSON), which a tag template would read as
    invalid actions. The warm-up's demonstrations are the bare actions under the env's instruction.

    kwargs:
      ``system`` (None): a system prompt replacing the env's instruction; ``{instruction}`` is filled in.
    """

    def __init__(self, system: str | None = None):
        self.system = system
        self.stop: list[str] = []
        self.end_pattern = None

    def system_prompt(self, instruction: str) -> str:
        return system_prompt(instruction, "", self.system).strip()

    def parse(self, text: str) -> ParsedAction:
        content = as_text(text).strip()
        if not content:
            return invalid(as_text(text))
        return ParsedAction(kind="message", content=content, valid=True)

    def render(self, action: str, thought: str = "") -> str:
        return action
