"""The embedded default's chat template: Qwen-style ChatML that renders tools, tool calls and tool replies in the
Hermes/Qwen2.5 layout (what :func:`openmanus_rl_core.models.loading.build_tokenizer` gives every tokenizer it trains).
"""

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nTo call a tool, reply with:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' }}"
    "{{- fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen-style ChatML (system / user / assistant), with ``add_generation_prompt`` support. With ``tools``, the
Hermes/Qwen2.5 layout, its wording kept short for a tiny model's positions: a system turn lists the tools' JSON
signatures and the ``<tool_call>`` format, an assistant's
``tool_calls`` are written as ``<tool_call>`` blocks, and ``tool`` replies as ``<tool_response>`` blocks in one user
turn. A conversation without tools renders exactly as plain ChatML."""
