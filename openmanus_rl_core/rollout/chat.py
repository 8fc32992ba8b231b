"""The token pieces of a chat template around turns (:class:`ChatDelta`), the tools a tool-calling template shows
(:func:`prompt_tools`), and a rendered prompt split back into its messages (:class:`ChatSplit`, for a served model
asked through a chat API)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


class ChatDelta:
    """The token pieces a chat template puts around turns, found once from fixed dummy contents.

    - ``prompt_ids(system, user, tools=None)``: the first prompt, ending with the assistant header; ``tools`` (OpenAI
      function schemas) go to the chat template (``apply_chat_template(..., tools=...)``).
    - ``renders_tools``: whether the chat template writes the tools it is given.
    - ``obs_ids(obs_ids, reply_ids)``: tokens between a reply and the next reply: ``[<end of assistant turn>] +
      <user header> + obs_ids + <end of user turn> + <assistant header>``; the end-of-turn tokens are left out when
      the reply already ends with them (the model generated its EOS).
    """

    _D = ("OMRLdummyA", "OMRLdummyB", "OMRLdummyC", "OMRLdummyS")

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        a, b, c, s = self._D
        full = self._render([("system", s), ("user", a), ("assistant", b), ("user", c)], True)
        closed = self._render([("system", s), ("user", a), ("assistant", b)], False)
        for d in (b, c):
            if full.count(d) != 1:
                raise ValueError("the tokenizer's chat template does not render plain message contents verbatim; "
                                 "it cannot be used for multi-turn rollouts")
        mid = full[full.index(b) + len(b): full.index(c)]
        tail = full[full.index(c) + len(c):]
        close = closed[closed.index(b) + len(b):] if closed.count(b) == 1 else ""
        self.mid_ids = self.encode(mid)
        self.tail_ids = self.encode(tail)
        # The assistant turn's end marker (e.g. "<|im_end|>", without the newline that follows it).
        self.end_ids = self.encode(close.rstrip()) if close.strip() else []
        if self.end_ids and self.mid_ids[: len(self.end_ids)] != self.end_ids:
            self.end_ids = []

    def _render(self, messages: list[tuple[str, str]], gen: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": r, "content": t} for r, t in messages], tools=tools, tokenize=False, add_generation_prompt=gen
        )

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template writes a tool it is given (a dummy tool's name shows in the prompt); found once."""
        if not hasattr(self, "_renders_tools"):
            tool = {"type": "function", "function": {"name": "OMRLdummyTool", "description": "",
                                                     "parameters": {"type": "object", "properties": {}}}}
            try:
                self._renders_tools = "OMRLdummyTool" in self._render(
                    [("system", self._D[3]), ("user", self._D[0])], True, [tool])
            except Exception:  # noqa: BLE001  (a template that cannot take tools does not write them)
                self._renders_tools = False
        return self._renders_tools

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str, user: str, tools: list[dict] | None = None) -> list[int]:
        text = self._render([("system", system), ("user", user)], True, tools)
        return self.encode(text)

    def obs_ids(self, obs_ids: Sequence[int], reply_ids: Sequence[int]) -> list[int]:
        mid = self.mid_ids
        k = len(self.end_ids)
        if k and len(reply_ids) >= k and list(reply_ids[-k:]) == self.end_ids:
            mid = mid[k:]
        return list(mid) + list(obs_ids) + list(self.tail_ids)


def prompt_tools(template: Any, env: Any, chat: ChatDelta, system: str) -> tuple[str, list[dict] | None]:
    """``(system prompt, tools)`` of an episode's chat. A tool-calling template (``calls_tools``, see
    :class:`~openmanus_rl_core.protocols.ActionTemplate`) shows the env's ``tools``, else its own (e.g. one
    ``act(action)`` tool for an env whose actions are text): through the chat template, or, when the chat template
    does not write tools, as the template's ``tool_prompt(tools)`` after the system prompt (tools then None). Any
    other template: ``(system, None)``. A tool-calling template with no tools to show is a ``ValueError``."""
    if not getattr(template, "calls_tools", False):
        return system, None
    tools = getattr(env, "tools", None) or getattr(template, "tools", None)
    if not tools:
        raise ValueError(f"the template calls tools, but the env {type(env).__name__} has no `tools`; for an env "
                         f"whose actions are text, set template.kwargs.text_tool=act (one tool, act(action: str))")
    tools = [dict(t) for t in tools]
    if chat.renders_tools:
        return system, tools
    return f"{system}\n\n{template.tool_prompt(tools)}".lstrip(), None


class ChatSplit:
    """Chat messages back from a prompt the run's chat template rendered (``api=chat``), split at the text the
    template puts before the system message, a user message and an assistant message (found from dummy contents)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, marks = tokenizer, ["OMRLsysS", "OMRLuserU", "OMRLasstA", "OMRLuserV"]
        full = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in zip(
            ("system", "user", "assistant", "user"), marks)], tokenize=False, add_generation_prompt=True)
        pieces = re.split("|".join(marks), full)
        if any(full.count(c) != 1 for c in marks) or pieces[3:] != pieces[1:3]:
            raise ValueError("api=chat: the run's chat template does not render each message's content verbatim "
                             "between the same texts for each role; use api=completions")
        self.head, self.before_user, self.before_assistant = pieces[:3]

    def messages(self, prompt_ids: Sequence[int]) -> list[dict[str, str]]:
        """The messages of a prompt that ends with the assistant header (``[system, user, (assistant, user)*]``)."""
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        start = text.find(self.head) if self.head else 0
        if start < 0 or not text.endswith(self.before_assistant):
            raise ValueError("api=chat: the prompt does not have the layout of the run's chat template; "
                             "use api=completions")
        role = {s: r for s, r in ((self.before_user, "user"), (self.before_assistant, "assistant")) if s}
        body = text[start + len(self.head): len(text) - len(self.before_assistant)]
        parts = re.split(f"({'|'.join(map(re.escape, role))})", body) if role else [body]
        return [{"role": r, "content": c} for r, c in zip(["system"] + [role[s] for s in parts[1::2]], parts[::2])]
