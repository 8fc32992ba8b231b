"""An OpenAI chat-completions request as the gateway accepts it (:class:`ChatRequest`), and the refusal it answers
otherwise (:class:`ApiError`, in OpenAI's error shape)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """A request the gateway refuses: the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}



@dataclass
class ChatRequest:
    messages: list[dict]
    tools: list | None
    n: int
    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    stop: list[str]
    logprobs: bool
    stream: bool
    include_stop: bool  # vLLM's include_stop_str_in_output: the reply as sampled, its stop string kept

    @staticmethod
    def parse(body: Any, model: str) -> "ChatRequest":
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("model") != model:
            raise ApiError(404, f"The model `{body.get('model')}` does not exist; this gateway serves `{model}` "
                                f"(OMRL_MODEL)", param="model", code="model_not_found")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        clean = [_message(m, i) for i, m in enumerate(messages)]
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ApiError(400, "tools must be a list of function tools", param="tools")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "stop must be a string or a list of strings", param="stop")
        n = _number(body, "n", int, 1, low=1, high=64)
        return ChatRequest(messages=clean, tools=tools, n=n,
                            temperature=_number(body, "temperature", float, None, low=0.0, high=2.0),
                            top_p=_number(body, "top_p", float, None, low=0.0, high=1.0),
                            max_tokens=_number(body, "max_completion_tokens", int, None, low=1)
                            or _number(body, "max_tokens", int, None, low=1),
                            stop=stop, logprobs=bool(body.get("logprobs")), stream=bool(body.get("stream")),
                            include_stop=bool(body.get("include_stop_str_in_output")))


def _number(body: dict, name: str, kind: type, default: Any, low: float | None = None,
            high: float | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ApiError(400, f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}",
                       param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ApiError(400, f"{name}={value!r} is out of range [{low}, {high}]", param=name)
    return kind(value)


# The role a chat template knows for an OpenAI role it may not (developer: OpenAI's newer name for system).
_TEMPLATE_ROLE = {"developer": "system"}


def _message(m: Any, i: int) -> dict:
    """A message with its text contents joined (the chat template renders text only)."""
    if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise ApiError(400, f"messages[{i}] must be an object with a role of system, developer, user, assistant "
                            f"or tool, got {m!r}"[:300], param=f"messages[{i}]")
    out = dict(m, role=_TEMPLATE_ROLE.get(m["role"], m["role"]))
    content = m.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise ApiError(400, f"messages[{i}].content: only text parts are supported", param=f"messages[{i}]")
        out["content"] = "".join(texts)
    elif content is None:
        out["content"] = ""
    elif not isinstance(content, str):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                       param=f"messages[{i}]")
    calls = m.get("tool_calls")
    if calls:  # chat templates take the arguments as a mapping; OpenAI sends them as a JSON string
        out["tool_calls"] = [_template_call(c, i) for c in calls]
    return out


def _template_call(call: Any, i: int) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"messages[{i}].tool_calls: each needs a function with a name", param=f"messages[{i}]")
    args = fn.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        raise ApiError(400, f"messages[{i}].tool_calls: arguments are not JSON: {args!r}"[:300],
                       param=f"messages[{i}]") from None
    return {**call, "function": {"name": fn["name"], "arguments": args}}
