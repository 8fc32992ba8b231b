"""Built-in action templates: how the model is asked to act and how its replies are read.

=========  ===================================================  ===========  ================
name       reply                                                kind         stop
=========  ===================================================  ===========  ================
react      ``<think>...</think><action>...</action>``           action       ``</action>``
agentgym   ``Thought: ...\\nAction: ...`` (or ``Action:\\n...``)  action       ``\\nObservation:``
json_tool  ``<tool_call>{"name": "act", "arguments": {...}}``   tool_call    ``</tool_call>``
message    the whole reply, in whatever format                  message      (end of turn)
=========  ===================================================  ===========  ================

The tool-calling family (:mod:`openmanus_rl_templates.tool_calls`): the env's tools reach the model through its chat
template, and a call reaches ``Env.step`` as the canonical text ``{"name": ..., "arguments": {...}}``.

============  ==============================================================  ================
name          reply                                                           stop
============  ==============================================================  ================
qwen_tools    ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``  ``</tool_call>``
hermes_tools  ``<tool_call>\\n{ "arguments": {...}, "name": ...}\\n</tool_call>``  ``</tool_call>``
llama3_tools  ``[<|python_tag|>]{"name": ..., "parameters": {...}}``             (end of turn)
============  ==============================================================  ================

Every ``parse`` is total: any text gives a :class:`~openmanus_rl_core.protocols.ParsedAction`, an
unreadable one with ``kind="invalid"``, ``valid=False`` and the raw text as ``content``.
"""

from openmanus_rl_templates.agentgym import AgentGymTemplate
from openmanus_rl_templates.hermes_tools import HermesToolsTemplate
from openmanus_rl_templates.json_tool import JsonToolTemplate
from openmanus_rl_templates.llama3_tools import Llama3ToolsTemplate
from openmanus_rl_templates.message import MessageTemplate
from openmanus_rl_templates.qwen_tools import QwenToolsTemplate
from openmanus_rl_templates.react import ReactTemplate
from openmanus_rl_templates.tool_calls import ToolCallTemplate

__all__ = ["ReactTemplate", "AgentGymTemplate", "JsonToolTemplate", "ToolCallTemplate", "QwenToolsTemplate",
           "Llama3ToolsTemplate", "HermesToolsTemplate", "MessageTemplate"]
