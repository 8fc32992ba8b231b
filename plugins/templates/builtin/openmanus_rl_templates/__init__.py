"""Built-in action templates: how the model is asked to act and how its replies are read.

=========  ===================================================  ===========  ================
name       reply                                                kind         stop
=========  ===================================================  ===========  ================
react      ``<think>...</think><action>...</action>``           action       ``</action>``
agentgym   ``Thought: ...\\nAction: ...`` (or ``Action:\\n...``)  action       ``\\nObservation:``
json_tool  ``<tool_call>{"name": "act", "arguments": {...}}``   tool_call    ``</tool_call>``
=========  ===================================================  ===========  ================

Every ``parse`` is total: any text gives a :class:`~openmanus_rl_core.protocols.ParsedAction`, an
unreadable one with ``kind="invalid"``, ``valid=False`` and the raw text as ``content``.
"""

from openmanus_rl_templates.agentgym import AgentGymTemplate
from openmanus_rl_templates.json_tool import JsonToolTemplate
from openmanus_rl_templates.react import ReactTemplate

__all__ = ["ReactTemplate", "AgentGymTemplate", "JsonToolTemplate"]
