"""``POST /v1/messages``: Anthropic's Messages API (the ``anthropic`` SDK; its key in ``x-api-key``) over the
gateway's chat path.

A request becomes a :class:`~openmanus_rl_core.gateway.requests.ChatRequest` (so it is batched, rendered and
recorded like a chat completion):

- ``system`` (a string or text blocks) -> a leading system message;
- ``messages``: ``text`` blocks; an assistant's ``tool_use`` blocks -> its ``tool_calls``; a user's
  ``tool_result`` blocks -> ``tool`` messages (then the user's text, if any); an assistant's ``thinking`` block ->
  the ``<think>`` block the model wrote, in front of its text. Any other block (images, documents) is refused;
- ``tools`` (``name``, ``description``, ``input_schema``) -> function tools; ``tool_choice`` (``auto``, ``any``,
  ``tool``, ``none``; ``disable_parallel_tool_use``) -> the chat request's ``tool_choice`` and
  ``parallel_tool_calls``; ``max_tokens`` (required, as Anthropic requires it), ``stop_sequences``, ``temperature``,
  ``top_p``.

``POST /v1/messages/count_tokens`` answers the prompt's length as the chat template renders it (nothing is
generated or recorded).

The reply: ``text`` and ``tool_use`` blocks, ``stop_reason`` ``end_turn``, ``max_tokens``, ``stop_sequence`` or
``tool_use``. ``stream`` sends Anthropic's events (``message_start``, ``content_block_start`` / ``_delta`` /
``_stop``, ``message_delta``, ``message_stop``): text deltas (and a thinking block) as they are generated where the
rule of gateway/sse.py lets them go out live, keep-alive comments while nothing is new, the rest at the end; an
engine failure ends it on Anthropic's ``error`` event. Refusals come in Anthropic's error shape.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

from openmanus_rl_core.gateway.requests import (ApiError, ChatRequest, check_tool_choice, check_tools, checked_body,
                                                number, text_of)
from openmanus_rl_core.gateway.sse import KEEPALIVE, sse

HONOURED = frozenset({"model", "messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences",
                      "temperature", "top_p", "stream"})
# Accepted and ignored (docs/gateway.md): they change nothing the policy samples.
IGNORED = frozenset({"metadata", "service_tier"})
NOOP = {"top_k": (0, "the run's sampling decides top-k"),
        "thinking": ({"type": "disabled"}, "the policy's reasoning, if any, is in its text"),
        "container": (None, "there are no containers here"),
        "mcp_servers": (None, "the gateway reaches no MCP server"),
        "context_management": (None, "the gateway never edits a context")}


@dataclass
class MessagesCall:
    chat: ChatRequest
    stream: bool


def parse(body: Any, model: str, counting: bool = False) -> MessagesCall:
    """``counting``: a ``/v1/messages/count_tokens`` request, which has no ``max_tokens``."""
    body = checked_body(body, model, HONOURED, "/v1/messages", ignored=IGNORED, noop=NOOP)
    if body.get("max_tokens") is None and not counting:
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    system = body.get("system")
    messages = [{"role": "system", "content": _text(system, "system")}] if system else []
    for i, m in enumerate(raw):
        messages += _messages(m, f"messages[{i}]")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools must be a list", param="tools")
    tools = check_tools([_chat_tool(t, i) for i, t in enumerate(tools or [])] or None)
    choice, parallel = _tool_choice(body.get("tool_choice"))
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop_sequences must be a list of strings", param="stop_sequences")
    chat = ChatRequest(messages=messages, tools=tools, stop=stop,
                       temperature=number(body, "temperature", float, None, low=0.0, high=1.0),
                       top_p=number(body, "top_p", float, None, low=0.0, high=1.0),
                       max_tokens=number(body, "max_tokens", int, None, low=1),
                       tool_choice=check_tool_choice(choice, tools), parallel_tool_calls=parallel)
    return MessagesCall(chat, stream=bool(body.get("stream")))


def _chat_tool(tool: Any, i: int) -> dict:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise ApiError(400, f"tools[{i}]: only custom tools (name, description, input_schema) are served, got "
                            f"{kind!r}"[:300], param=f"tools[{i}]")
    fn = {"name": tool["name"]}
    if tool.get("description"):
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


# Anthropic's tool_choice types as chat completions' tool_choice.
TOOL_CHOICES = {"auto": lambda choice: "auto", "any": lambda choice: "required", "none": lambda choice: "none",
                "tool": lambda choice: {"type": "function", "function": {"name": choice.get("name")}}}


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    if choice is None:
        return None, None
    chat = TOOL_CHOICES.get(choice.get("type") if isinstance(choice, dict) else None)
    if chat is None:
        raise ApiError(400, f"tool_choice must be of type {', '.join(TOOL_CHOICES)}, got {json.dumps(choice)[:120]}",
                       param="tool_choice")
    mapped = chat(choice)
    disable = choice.get("disable_parallel_tool_use")
    return mapped, None if disable is None else not disable


def _text(content: Any, where: str) -> str:
    return text_of(content, where, {"text": "text"})


class _Turn:
    """One Anthropic message being read: its texts, thinking and tool calls, and the tool messages of its results."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.think: str | None = None
        self.calls: list[dict] = []
        self.results: list[dict] = []


def _read_text(turn: _Turn, block: dict, at: str) -> None:
    turn.texts.append(_text([block], at))


def _read_thinking(turn: _Turn, block: dict, at: str) -> None:
    turn.think = (turn.think or "") + str(block.get("thinking", ""))


def _read_tool_use(turn: _Turn, block: dict, at: str) -> None:
    turn.calls.append({"id": block.get("id"), "type": "function",
                       "function": {"name": block.get("name"), "arguments": block.get("input") or {}}})


def _read_tool_result(turn: _Turn, block: dict, at: str) -> None:
    result = block.get("content")
    turn.results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                         "content": "" if result is None else _text(result, at + ".content")})


# The content blocks a message of each role may hold, and the reader of each.
BLOCKS = {"user": {"text": _read_text, "tool_result": _read_tool_result},
          "assistant": {"text": _read_text, "thinking": _read_thinking, "tool_use": _read_tool_use}}


def _messages(m: Any, where: str) -> list[dict]:
    """One Anthropic message as chat messages (a user's tool results are ``tool`` messages of their own)."""
    role = m.get("role") if isinstance(m, dict) else None
    if role not in BLOCKS:
        raise ApiError(400, f"{where}.role must be user or assistant, got {role!r}", param=where)
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of blocks", param=where)
    turn = _Turn()
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        read = BLOCKS[role].get(block.get("type") if isinstance(block, dict) else None)
        if read is None:
            kind = block.get("type") if isinstance(block, dict) else block
            raise ApiError(400, f"{at}: blocks of type {kind!r} are not served in a {role} message (a user's: "
                                f"text, tool_result; an assistant's: text, thinking, tool_use)"[:300], param=at)
        read(turn, block, at)
    return FINISH[role](turn)


def _assistant_turn(turn: _Turn) -> list[dict]:
    think = f"<think>{turn.think}</think>" if turn.think is not None else ""
    message = {"role": "assistant", "content": think + "".join(turn.texts)}
    if turn.calls:
        message["tool_calls"] = turn.calls
    return [message]


def _user_turn(turn: _Turn) -> list[dict]:
    if turn.texts or not turn.results:
        turn.results.append({"role": "user", "content": "".join(turn.texts)})
    return turn.results


# A message's chat messages, from what its blocks put in the turn, by role.
FINISH = {"user": _user_turn, "assistant": _assistant_turn}


def build(call: MessagesCall, generated: Any, model: str, message_id: str | None = None) -> dict:
    """The Anthropic ``message`` for one generated reply (``message_id``: the id a stream announced)."""
    reply = generated.replies[0]
    content: list[dict] = []
    think, text = reply.reasoning, reply.content  # the family's reasoning parser split them
    if think is not None:  # no signature: the block is the policy's own text, not Anthropic's
        content.append({"type": "thinking", "thinking": think, "signature": ""})
    if text or not reply.tool_calls:
        content.append({"type": "text", "text": text})
    for tc in reply.tool_calls:
        content.append({"type": "tool_use", "id": "toolu_" + tc["id"].removeprefix("call_"),
                        "name": tc["function"]["name"], "input": _arguments(tc["function"]["arguments"])})
    stop = {"length": "max_tokens", "tool_calls": "tool_use"}.get(reply.finish)
    if stop is None:
        stop = "stop_sequence" if reply.stop_sequence else "end_turn"
    return {"id": message_id or f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop, "stop_sequence": reply.stop_sequence,
            "usage": {"input_tokens": len(generated.prompt_ids), "output_tokens": generated.completion_tokens}}


def _arguments(text: str) -> dict:
    """A tool call's arguments as the object ``tool_use.input`` must be (what the policy wrote, if not one)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    return value if isinstance(value, dict) else {"arguments": value}


def events(message: dict) -> Iterator[bytes]:
    """The finished ``message`` as Anthropic streams one."""
    yield _started(message)
    for index, block in enumerate(message["content"]):
        yield from _block(index, block)
    yield from _ended(message)


async def stream(call: MessagesCall, live: Any, model: str) -> AsyncIterator[bytes]:
    """A message streamed while it is generated (:class:`~openmanus_rl_core.gateway.sse.Live`): ``message_start``
    at once, keep-alives while nothing is new, a thinking block and text deltas as the rule of gateway/sse.py lets
    them go out live, then the rest of the finished message's events."""
    message_id = f"msg_{uuid.uuid4().hex}"
    yield _started({"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                    "usage": {"input_tokens": live.prompt_tokens}})
    opened: dict[str, int] = {}  # the blocks started live: type -> index
    async for item in live.events():
        yield KEEPALIVE if item is None else _LIVE[item[1]](opened, item[2])
    try:
        generated = await live.result()
    except Exception as exc:  # the engine failed: the stream ends on Anthropic's error event
        yield _event("error", error={"type": "api_error", "message": f"{type(exc).__name__}: {exc}"})
        return
    message = build(call, generated, model, message_id)
    for index, block in enumerate(message["content"]):
        if block["type"] == "text" and "text" in opened:
            rest = live.texts[0].rest(block["text"])
            if rest:
                yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": rest})
            yield _event("content_block_stop", index=index)
        elif block["type"] not in opened:
            yield b"".join(_block(index, block))
    yield b"".join(_ended(message))


def _live_reasoning(opened: dict[str, int], text: str) -> bytes:
    """The reasoning, whole once its block closed: a thinking block of its own."""
    opened["thinking"] = len(opened)
    return b"".join(_block(opened["thinking"], {"type": "thinking", "thinking": text, "signature": ""}))


def _live_text(opened: dict[str, int], text: str) -> bytes:
    """A text delta, the text block started with the first."""
    start = b""
    if "text" not in opened:
        opened["text"] = len(opened)
        start = _event("content_block_start", index=opened["text"], content_block={"type": "text", "text": ""})
    return start + _event("content_block_delta", index=opened["text"], delta={"type": "text_delta", "text": text})


# What goes out live, by the kind Live.events() names it.
_LIVE = {"reasoning": _live_reasoning, "content": _live_text}


def _event(kind: str, **fields: Any) -> bytes:
    return sse(dict(type=kind, **fields), event=kind)


def _started(message: dict) -> bytes:
    start = dict(message, content=[], stop_reason=None, stop_sequence=None,
                 usage=dict(message["usage"], output_tokens=0))
    return _event("message_start", message=start)


# A content block's type: its fields as the block's start sends them (empty), and the one delta that fills them.
_DELTAS = {
    "text": lambda b: ({"text": ""}, {"type": "text_delta", "text": b["text"]}),
    "thinking": lambda b: ({"thinking": ""}, {"type": "thinking_delta", "thinking": b["thinking"]}),
    "tool_use": lambda b: ({"input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}),
}


def _block(index: int, block: dict) -> Iterator[bytes]:
    empty, delta = _DELTAS[block["type"]](block)
    first = dict(block, **empty)
    yield _event("content_block_start", index=index, content_block=first)
    yield _event("content_block_delta", index=index, delta=delta)
    yield _event("content_block_stop", index=index)


def _ended(message: dict) -> Iterator[bytes]:
    yield _event("message_delta", delta={"stop_reason": message["stop_reason"],
                                         "stop_sequence": message["stop_sequence"]},
                 usage={"output_tokens": message["usage"]["output_tokens"]})
    yield _event("message_stop")
