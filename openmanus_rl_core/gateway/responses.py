"""``POST /v1/responses``: the Responses API (``client.responses.create``, the OpenAI Agents SDK's default model
API) over the gateway's chat path.

A request is translated into a :class:`~openmanus_rl_core.gateway.requests.ChatRequest`, so its call is batched,
rendered by the chat template and recorded exactly like a chat completion:

- ``instructions`` -> a leading system message (not carried over by ``previous_response_id``, as OpenAI's API does);
- ``input``: a string (one user message) or items: messages (``input_text`` / ``output_text`` parts; any other
  part is refused), ``function_call`` (an assistant's tool call; consecutive ones are one assistant turn),
  ``function_call_output`` (a ``tool`` message), ``reasoning`` (put back in front of the assistant turn it preceded
  as the ``<think>`` block the model wrote, so the re-rendered prompt holds the model's own text);
- function ``tools`` (flat: ``{"type": "function", "name", "parameters"}``) -> the chat template's tool shape;
  ``tool_choice``, ``parallel_tool_calls`` and ``text.format`` -> the chat request's ``tool_choice``,
  ``parallel_tool_calls`` and ``response_format``;
- ``previous_response_id``: the conversation of a response of the same episode (its input and its output), the new
  input appended. The gateway keeps an episode's responses until the episode closes (``store`` unset; false: not
  kept; true, a request to store them for retrieval, is refused),
  ``serve``'s last :attr:`~openmanus_rl_core.gateway.server.Gateway.SERVED_RESPONSES`.

The reply's ``output``: a ``reasoning`` item for a leading ``<think>`` block, a ``message`` with the text, one
``function_call`` item per tool call. Its status is ``incomplete`` only when the request's own ``max_output_tokens``
cut it; a reply cut by the run's length cap is ``completed`` (see :func:`build`). ``stream`` sends the SDK's typed
events (``response.created`` ... ``response.completed``, or ``response.incomplete``): the text deltas (and a
reasoning item) as they are generated where the rule of gateway/sse.py lets them go out live, keep-alive comments
while nothing is new, the rest when the reply is finished.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from pydantic import TypeAdapter

from openmanus_rl_core.gateway.requests import (ApiError, ChatRequest, check_response_format, check_tool_choice,
                                                check_tools, checked_body, flag, number, template_call, text_of,
                                                unsupported)
from openmanus_rl_core.gateway.sse import KEEPALIVE, sse

HONOURED = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                      "max_output_tokens", "temperature", "top_p", "text", "previous_response_id", "stream",
                      "metadata", "include"})
# Accepted and ignored (docs/gateway.md): nothing a policy samples depends on them, or the gateway does what they
# ask anyway (truncation: a prompt too long is refused, never cut).
IGNORED = frozenset({"user", "safety_identifier", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
                     "service_tier", "reasoning", "truncation", "max_tool_calls", "stream_options", "moderation"})
NOOP = {"background": (False, "a response is generated while the request waits"),
        "store": (False, "responses are kept only within their episode, for previous_response_id, and cannot be "
                         "retrieved; leave store unset for that, or set it false"),
        "conversation": (None, "there is no Conversations API here: send previous_response_id or the items"),
        "prompt": (None, "there are no stored prompt templates here"),
        "context_management": (None, "the gateway never compacts a context"),
        "top_logprobs": (0, "the engine records the sampled token's log-prob only "
                            "(include message.output_text.logprobs gives it)")}
# include values: the sampled tokens' log-probs are given; the others name what this gateway never produces.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
INCLUDE_EMPTY = frozenset({"reasoning.encrypted_content"})

_EVENT = None  # TypeAdapter(ResponseStreamEvent), built on first use


@dataclass
class ResponsesCall:
    """A parsed ``/v1/responses`` request: the chat request it becomes, the conversation a later
    ``previous_response_id`` continues from (its messages without the instructions), and what the reply echoes."""

    chat: ChatRequest
    conversation: list[dict]
    body: dict
    stream: bool
    store: bool
    logprobs: bool


def parse(body: Any, gateway: Any, record: Any) -> ResponsesCall:
    body = checked_body(body, gateway.model, HONOURED, "/v1/responses", ignored=IGNORED, noop=NOOP)
    include = body.get("include") or []
    if not isinstance(include, list) or any(i != INCLUDE_LOGPROBS and i not in INCLUDE_EMPTY for i in include):
        raise unsupported("include", f"include={json.dumps(include)[:120]}: only {INCLUDE_LOGPROBS!r} (and "
                                     f"{sorted(INCLUDE_EMPTY)}, which give nothing here) are served")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", param="instructions")
    previous = body.get("previous_response_id")
    conversation = list(_previous(previous, gateway, record)) if previous is not None else []
    conversation += input_messages(body.get("input"))
    if not conversation:
        raise ApiError(400, "input must be a string or a non-empty list of items", param="input")
    tools = check_tools([_chat_tool(t, i) for i, t in enumerate(_list(body, "tools"))] or None)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    text = body.get("text") or {}
    if not isinstance(text, dict):
        raise ApiError(400, "text must be an object", param="text")
    chat = ChatRequest(messages=messages, tools=tools,
                       temperature=number(body, "temperature", float, None, low=0.0, high=2.0),
                       top_p=number(body, "top_p", float, None, low=0.0, high=1.0),
                       max_tokens=number(body, "max_output_tokens", int, None, low=1),
                       tool_choice=check_tool_choice(_by_type(_TOOL_CHOICES, body.get("tool_choice")), tools),
                       parallel_tool_calls=flag(body, "parallel_tool_calls"),
                       response_format=check_response_format(_by_type(_FORMATS, text.get("format")), "text.format"))
    return ResponsesCall(chat, conversation, body, stream=bool(flag(body, "stream")),
                         store=flag(body, "store") is not False, logprobs=INCLUDE_LOGPROBS in include)


def _list(body: dict, name: str) -> list:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(400, f"{name} must be a list", param=name)
    return value


def _previous(response_id: Any, gateway: Any, record: Any) -> list[dict]:
    store = record.responses if record is not None else gateway.served_responses
    if not isinstance(response_id, str) or response_id not in store:
        raise ApiError(400, f"previous_response_id {response_id!r} names no response of this episode (responses are "
                            f"kept within their episode, and not at all with store=false)",
                       param="previous_response_id", code="previous_response_not_found")
    return store[response_id]


def _chat_tool(tool: Any, i: int) -> dict:
    """A Responses function tool (flat) in the chat template's shape."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise ApiError(400, f"tools[{i}]: only function tools are served, got type {kind!r}"[:300],
                       param=f"tools[{i}]")
    if not isinstance(tool.get("name"), str):
        raise ApiError(400, f"tools[{i}] needs a name", param=f"tools[{i}]")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _by_type(table: dict[str, Callable[[dict], dict]], value: Any) -> Any:
    """``value`` in chat-completions' shape where ``table`` names its type; else as it is (checked later)."""
    convert = table.get(value.get("type")) if isinstance(value, dict) else None
    return convert(value) if convert else value


# Responses' flat shapes of a tool choice and a text format, by type, in chat-completions' nested ones.
_TOOL_CHOICES: dict[str, Callable[[dict], dict]] = {
    "function": lambda choice: {"type": "function", "function": {"name": choice.get("name")}}}
_FORMATS: dict[str, Callable[[dict], dict]] = {
    "json_schema": lambda f: {"type": "json_schema", "json_schema": {
        k: f[k] for k in ("name", "schema", "strict", "description") if k in f}}}


# ---------------------------------------------------------------------------------------------- input items
def input_messages(items: Any) -> list[dict]:
    """Responses ``input`` as chat messages, in the chat template's terms (see the module doc)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if items is None:
        return []
    if not isinstance(items, list):
        raise ApiError(400, "input must be a string or a list of items", param="input")
    transcript = _Transcript()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        fold = ITEMS.get(kind)
        if fold is None:
            raise ApiError(400, f"{where}: items of type {kind!r} are not served ({', '.join(ITEMS)} are)", param=where)
        fold(transcript, item, where)
    return transcript.end()


class _Transcript:
    """Input items folded into chat messages, one item at a time: ``turn`` is the assistant turn the next
    ``function_call`` joins, ``think`` a reasoning item's text kept for the assistant turn that follows it."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.turn: dict | None = None
        self.think: str | None = None

    def _assistant(self, text: str) -> None:
        self.turn = {"role": "assistant", "content": _with_think(self.think, text)}
        self.think = None
        self.messages.append(self.turn)

    def reasoning(self, item: dict, where: str) -> None:
        self.think = (self.think or "") + _reasoning_text(item, where)

    def message(self, item: dict, where: str) -> None:
        fold = _ROLES.get(item.get("role"))
        if fold is None:
            raise ApiError(400, f"{where}.role must be user, assistant, system or developer, got "
                                f"{item.get('role')!r}", param=where)
        fold(self, _text(item.get("content"), where + ".content"))

    def _said(self, role: str, text: str) -> None:
        self.messages.append({"role": role, "content": text})
        self.turn = None

    def function_call(self, item: dict, where: str) -> None:
        if self.turn is None or self.think is not None:
            self._assistant("")
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
        self.turn.setdefault("tool_calls", []).append(template_call(call, where))

    def function_call_output(self, item: dict, where: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                              "content": _text(item.get("output"), where + ".output")})
        self.turn = None

    def end(self) -> list[dict]:
        if self.think is not None:  # reasoning the conversation ends on: an assistant turn of its own
            self._assistant("")
        return self.messages


# A message item's role: the assistant's opens a turn; developer is the chat template's system.
_ROLES: dict[str, Callable[[_Transcript, str], None]] = {
    "assistant": _Transcript._assistant, "user": lambda t, text: t._said("user", text),
    "system": lambda t, text: t._said("system", text), "developer": lambda t, text: t._said("system", text)}

ITEMS: dict[str, Callable[[_Transcript, dict, str], None]] = {
    "message": _Transcript.message, "function_call": _Transcript.function_call,
    "function_call_output": _Transcript.function_call_output, "reasoning": _Transcript.reasoning}
"""The input item types served, each folded into the transcript by its method."""


def _with_think(think: str | None, text: str) -> str:
    return text if think is None else f"<think>{think}</think>{text}"


def _reasoning_text(item: dict, where: str) -> str:
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise ApiError(400, f"{where}.content must be a list of reasoning_text parts", param=where)
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


# A Responses message's text parts, each with the field that holds its text.
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def _text(content: Any, where: str) -> str:
    return text_of(content, where, TEXT_PARTS)


# ---------------------------------------------------------------------------------------------- the reply
def new_stamp() -> dict:
    """The ids and creation time of one response: a streamed one announces them before it is built."""
    return {"resp": f"resp_{uuid.uuid4().hex}", "rs": f"rs_{uuid.uuid4().hex}", "msg": f"msg_{uuid.uuid4().hex}",
            "created_at": time.time()}


def build(call: ResponsesCall, generated: Any, gateway: Any, record: Any, stamp: dict | None = None) -> Any:
    """The ``Response`` for one generated reply (its ids from ``stamp``: :func:`new_stamp`); its conversation kept
    for ``previous_response_id``."""
    from openai.types.responses import Response

    stamp = stamp or new_stamp()
    reply = generated.replies[0]
    output: list[dict] = []
    reasoning, text = reply.reasoning, reply.content  # the family's reasoning parser split them
    if reasoning is not None:
        output.append({"id": stamp["rs"], "type": "reasoning", "summary": [],
                       "content": [{"type": "reasoning_text", "text": reasoning}]})
    if text or not reply.tool_calls:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if call.logprobs:
            tokens = [gateway.tokenizer.decode([t]) for t in reply.call.completion_ids]
            part["logprobs"] = [{"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                                for s, lp in zip(tokens, reply.call.logprobs)]
        output.append({"id": stamp["msg"], "type": "message", "role": "assistant",
                       "status": "completed", "content": [part]})
    for tc in reply.tool_calls:
        output.append({"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "call_id": tc["id"],
                       "name": tc["function"]["name"], "arguments": tc["function"]["arguments"],
                       "status": "completed"})
    body = call.body
    # Incomplete only where the request's own max_output_tokens cut the reply, as OpenAI answers it. A reply cut by
    # the run's length cap or the context is answered as completed, its text as far as it went: the Agents SDK
    # raises on an incomplete response, which would drop the episode instead of training on the cut reply.
    asked = body.get("max_output_tokens")
    cut = reply.finish == "length" and asked is not None and len(reply.call.completion_ids) >= asked
    prompt, completion = len(generated.prompt_ids), generated.completion_tokens
    response = Response.model_validate(dict(
        _head(call, gateway, stamp), status="incomplete" if cut else "completed", output=output,
        incomplete_details={"reason": "max_output_tokens"} if cut else None,
        usage={"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
               "output_tokens": completion,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}))
    if call.store:
        kept = call.conversation + input_messages(output)
        if record is not None:
            record.responses[response.id] = kept
        else:
            gateway.served_responses[response.id] = kept
            while len(gateway.served_responses) > gateway.SERVED_RESPONSES:
                gateway.served_responses.popitem(last=False)
    return response


def _head(call: ResponsesCall, gateway: Any, stamp: dict) -> dict:
    """A response's fields that the reply does not change."""
    body = call.body
    tools = [dict(t, strict=t.get("strict", True)) for t in body.get("tools") or []]
    return {"id": stamp["resp"], "object": "response", "created_at": stamp["created_at"], "model": gateway.model,
            "error": None, "instructions": body.get("instructions"), "metadata": body.get("metadata"),
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tool_choice": body.get("tool_choice") or "auto", "tools": tools,
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"),
            "text": body.get("text") or {"format": {"type": "text"}}, "store": call.store}


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.model_dump(mode="json", exclude_unset=True) if hasattr(value, "model_dump") else value


def events(response: Any) -> Iterator[bytes]:
    """The finished ``response`` as the Responses API streams one: server-sent events of the SDK's own types."""
    out = Events()
    yield from out.opened(response)
    yield from out.finished(response)


async def stream(call: ResponsesCall, live: Any, gateway: Any, record: Any) -> AsyncIterator[bytes]:
    """A response streamed while it is generated (:class:`~openmanus_rl_core.gateway.sse.Live`): created and in
    progress at once, keep-alives while nothing is new, the reasoning and text deltas that may go out live, then the
    rest of the finished response's events."""
    from openai.types.responses import Response, ResponseError

    stamp, out = new_stamp(), Events()
    start = Response.model_validate(dict(_head(call, gateway, stamp), status="in_progress", output=[], usage=None,
                                         incomplete_details=None))
    yield b"".join(out.opened(start))
    async for item in live.events():
        yield KEEPALIVE if item is None else b"".join(out.live(item[1], item[2], stamp))
    try:
        generated = await live.result()
    except Exception as exc:  # the engine failed: the stream ends on response.failed, as OpenAI's does
        error = ResponseError(code="server_error", message=f"{type(exc).__name__}: {exc}")
        yield out.event("response.failed", response=start.model_copy(update={"status": "failed", "error": error}))
        return
    response = build(call, generated, gateway, record, stamp)
    yield b"".join(out.finished(response, live.texts[0].rest(generated.replies[0].content)))


class Events:
    """The numbered events of one streamed response: :meth:`opened`, then :meth:`live` (a reasoning item, text
    deltas) while it is generated, then :meth:`finished` (the rest; the items opened live are closed, not sent
    again)."""

    def __init__(self) -> None:
        global _EVENT
        if _EVENT is None:
            from openai.types.responses import ResponseStreamEvent

            _EVENT = TypeAdapter(ResponseStreamEvent)
        self.seq = iter(range(1 << 30))
        self.live_items: dict[str, int] = {}  # the items announced live: id -> output index

    def event(self, kind: str, **fields: Any) -> bytes:
        # As plain data: an event's part types are its own classes, not the output item's.
        fields = {k: _plain(v) for k, v in fields.items()}
        data = _EVENT.validate_python(dict(fields, type=kind, sequence_number=next(self.seq)))
        return sse(data.model_dump_json(exclude_unset=True), event=kind)

    def opened(self, response: Any) -> Iterator[bytes]:
        start = response.model_copy(update={"status": "in_progress", "output": [], "usage": None,
                                            "incomplete_details": None})
        yield self.event("response.created", response=start)
        yield self.event("response.in_progress", response=start)

    def live(self, kind: str, text: str, stamp: dict) -> Iterator[bytes]:  # kind: reasoning (whole) or content
        return {"reasoning": self._live_reasoning, "content": self._live_text}[kind](text, stamp)

    def _live_reasoning(self, text: str, stamp: dict) -> Iterator[bytes]:
        from openai.types.responses import ResponseReasoningItem

        item = ResponseReasoningItem.model_validate({"id": stamp["rs"], "type": "reasoning", "summary": [],
                                                     "content": [{"type": "reasoning_text", "text": text}]})
        self.live_items[item.id] = len(self.live_items)
        yield from self._reasoning(self.live_items[item.id], item)

    def _live_text(self, text: str, stamp: dict) -> Iterator[bytes]:
        from openai.types.responses import ResponseOutputMessage

        if stamp["msg"] not in self.live_items:
            item = ResponseOutputMessage.model_validate({
                "id": stamp["msg"], "type": "message", "role": "assistant", "status": "in_progress",
                "content": [{"type": "output_text", "text": "", "annotations": []}]})
            self.live_items[item.id] = len(self.live_items)
            yield from self._message(self.live_items[item.id], item)
        yield self.event("response.output_text.delta", content_index=0, delta=text, logprobs=[],
                         output_index=self.live_items[stamp["msg"]], item_id=stamp["msg"])

    def _reasoning(self, index: int, item: Any) -> Iterator[bytes]:
        at = {"output_index": index, "item_id": item.id}
        text = "".join(p.text for p in item.content or [])
        yield self.event("response.output_item.added", output_index=index,
                         item=item.model_copy(update={"content": [], "status": "in_progress"}))
        yield self.event("response.reasoning_text.delta", content_index=0, delta=text, **at)
        yield self.event("response.reasoning_text.done", content_index=0, text=text, **at)
        yield self.event("response.output_item.done", output_index=index, item=item)

    def _message(self, index: int, item: Any) -> Iterator[bytes]:
        part = item.content[0]
        yield self.event("response.output_item.added", output_index=index,
                         item=item.model_copy(update={"content": [], "status": "in_progress"}))
        empty = part.model_copy(update={"text": "", "logprobs": []})
        yield self.event("response.content_part.added", content_index=0, part=empty, output_index=index,
                         item_id=item.id)

    def finished(self, response: Any, rest: str | None = None) -> Iterator[bytes]:
        """``rest``: what of the message's text did not go out live."""
        ends = {"reasoning": self._end_reasoning, "message": self._end_message, "function_call": self._end_call}
        for index, item in enumerate(response.output):
            yield from ends[item.type](index, item, rest)
        done = "response.incomplete" if response.status == "incomplete" else "response.completed"
        yield self.event(done, response=response)

    def _end_reasoning(self, index: int, item: Any, rest: str | None) -> Iterator[bytes]:
        if item.id not in self.live_items:  # a live one went out whole, done included
            yield from self._reasoning(index, item)

    def _end_message(self, index: int, item: Any, rest: str | None) -> Iterator[bytes]:
        at = {"output_index": index, "item_id": item.id}
        part, opened = item.content[0], item.id in self.live_items
        if not opened:
            yield from self._message(index, item)
        delta, logprobs = (rest if opened else part.text), part.logprobs or []
        if delta or logprobs or not opened:
            yield self.event("response.output_text.delta", content_index=0, delta=delta, logprobs=logprobs, **at)
        yield self.event("response.output_text.done", content_index=0, text=part.text, logprobs=logprobs, **at)
        yield self.event("response.content_part.done", content_index=0, part=part, **at)
        yield self.event("response.output_item.done", output_index=index, item=item)

    def _end_call(self, index: int, item: Any, rest: str | None) -> Iterator[bytes]:
        at = {"output_index": index, "item_id": item.id}
        yield self.event("response.output_item.added", output_index=index,
                         item=item.model_copy(update={"arguments": "", "status": "in_progress"}))
        yield self.event("response.function_call_arguments.delta", delta=item.arguments, **at)
        yield self.event("response.function_call_arguments.done", arguments=item.arguments, name=item.name, **at)
        yield self.event("response.output_item.done", output_index=index, item=item)
