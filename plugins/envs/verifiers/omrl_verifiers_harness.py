"""The in-process chat harness that ``env=verifiers`` plays every seat with (verifiers 0.4, v1 API).

A harness id resolves to a top-level module that exports one ``Harness`` subclass in ``__all__``, so this module
sits at the top level of the distribution (``openmanus-rl-env-verifiers``); the env's config names it by
:data:`HARNESS_ID`. Each segment of a rollout is one chat completion, sent to the rollout's interception endpoint
with the rollout's secret: the interception forwards it to the episode's gateway and records the trace, the taskset
scores it. No program is launched, nothing is installed, nothing leaves 127.0.0.1 (verifiers' own harnesses run a
``uv`` script or a coding agent that is downloaded first). A later segment (a taskset that answers the reply and
asks again) is the whole conversation so far, replayed by verifiers' default ``resume``.

Not supported: MCP tool servers (``SUPPORTS_MCP`` is False, so verifiers refuses a task that needs them) and
harness-side tool execution.
"""

from __future__ import annotations

import openai
import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult

__all__ = ["InProcessChatHarness"]

HARNESS_ID = "omrl_verifiers_harness"


class InProcessChatHarnessConfig(vf.HarnessConfig):
    pass


class InProcessChatHarness(vf.Harness[InProcessChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True  # the task's system prompt is its own message
    SUPPORTS_RESUME = True  # a later segment replays the conversation (Harness.resume)
    EXECUTES_CODE = False  # the model is given no execution: no subprocess-runtime warning
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [message_to_wire(m) for m in prompt]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(exit_code=0, stdout="", stderr="")
