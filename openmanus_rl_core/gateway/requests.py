"""An OpenAI chat-completions request as the gateway accepts it (:class:`ChatRequest`), and the refusal it answers
otherwise (:class:`ApiError`, in OpenAI's error shape, or Anthropic's on ``/v1/messages``).

Every field of a request is honoured, ignored (:data:`IGNORED`, listed in docs/gateway.md) or refused with a 400
that names it: a field that would change what is sampled and that the engine cannot do (``presence_penalty``,
``logit_bias``, ``top_logprobs``, ...) is refused unless it is at its no-op value, and a field OpenAI does not know
either is refused as OpenAI refuses it (``Unrecognized request argument``). ``/v1/responses`` and ``/v1/messages``
(gateway/responses.py, gateway/messages.py) translate their requests into a :class:`ChatRequest`, so every call
takes the same path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable


class ApiError(Exception):
    """A request the gateway refuses: the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """Anthropic's error shape (``/v1/messages``): its type is named by the status, as Anthropic's API names it."""
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                409: "invalid_request_error", 405: "invalid_request_error"}.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def unsupported(name: str, why: str) -> ApiError:
    return ApiError(400, f"{name} is not supported by this gateway: {why}", param=name, code="unsupported_parameter")


@dataclass
class ChatRequest:
    """One generation request, whatever route it came by: the conversation in the chat template's terms (text
    contents, ``tool_calls`` with mapping arguments) and how to sample and answer it.

    ``tool_choice`` (``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``),
    ``parallel_tool_calls`` and ``response_format`` (``{"type": "text" | "json_object"}`` or ``{"type":
    "json_schema", "json_schema": {"name", "schema", "strict"}}``) are in chat-completions' shape, whichever route
    they came by: what constrained decoding builds its constraint from."""

    messages: list[dict]
    tools: list | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's extra field (0 or -1: off)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    stream: bool = False
    include_stop: bool = False  # vLLM's include_stop_str_in_output: the reply as sampled, its stop string kept
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None

    @staticmethod
    def parse(body: Any, model: str) -> "ChatRequest":
        body = checked_body(body, model, HONOURED, "/v1/chat/completions")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        clean = [_message(m, i) for i, m in enumerate(messages)]
        tools = check_tools(body.get("tools"))
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "stop must be a string or a list of strings", param="stop")
        n = number(body, "n", int, 1, low=1, high=64)
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise ApiError(400, f"stream_options must be an object, got {options!r}", param="stream_options")
        return ChatRequest(messages=clean, tools=tools, n=n,
                           temperature=number(body, "temperature", float, None, low=0.0, high=2.0),
                           top_p=number(body, "top_p", float, None, low=0.0, high=1.0),
                           top_k=number(body, "top_k", int, None, low=-1),
                           max_tokens=number(body, "max_completion_tokens", int, None, low=1)
                           or number(body, "max_tokens", int, None, low=1),
                           stop=stop, logprobs=bool(body.get("logprobs")), stream=bool(body.get("stream")),
                           include_stop=bool(body.get("include_stop_str_in_output")),
                           include_usage=bool((options or {}).get("include_usage")),
                           tool_choice=check_tool_choice(body.get("tool_choice"), tools),
                           parallel_tool_calls=flag(body, "parallel_tool_calls"),
                           response_format=check_response_format(body.get("response_format"), "response_format"))


# /v1/chat/completions: the fields read (ChatRequest.parse), those accepted and ignored, and those refused unless
# at their no-op value. Any other field is refused, as OpenAI refuses it.
HONOURED = frozenset({"model", "messages", "tools", "n", "temperature", "top_p", "max_tokens", "max_completion_tokens",
                      "stop", "logprobs", "stream", "stream_options", "include_stop_str_in_output", "tool_choice",
                      "parallel_tool_calls", "response_format", "top_k"})
# Accepted and ignored: they change nothing a policy samples (user, metadata, store, prompt caching, service tier),
# or they cannot be honoured per request in a batched engine and training samples as the run says anyway (seed).
IGNORED = frozenset({"user", "metadata", "store", "seed", "service_tier", "prompt_cache_key",
                     "prompt_cache_retention", "safety_identifier", "reasoning_effort", "verbosity"})
# Refused with a 400 unless at their no-op value: the engine samples from the policy as it is.
NOOP = {"frequency_penalty": (0, "the engine samples the policy as it is, with no penalty"),
        "presence_penalty": (0, "the engine samples the policy as it is, with no penalty"),
        "logit_bias": ({}, "the engine samples the policy as it is, with no bias"),
        "top_logprobs": (0, "the engine records the sampled token's log-prob only (logprobs=true gives it)"),
        "modalities": (["text"], "the policy writes text only"),
        "audio": (None, "the policy writes text only"),
        "prediction": (None, "there is no predicted-output decoding"),
        "web_search_options": (None, "the gateway has no web search"),
        "functions": (None, "the legacy functions field is not read: send tools"),
        "function_call": (None, "the legacy function_call field is not read: send tool_choice"),
        # vLLM's extra sampling fields (sent through extra_body)
        "min_p": (0, "the engine samples with temperature, top_p and top_k only"),
        "repetition_penalty": (1, "the engine samples the policy as it is, with no penalty")}


def checked_body(body: Any, model: str, honoured: frozenset, route: str,
                 ignored: frozenset = IGNORED, noop: dict | None = None) -> dict:
    """``body`` as a JSON object naming the served model, every field of it honoured, ignored or at its no-op value;
    :class:`ApiError` otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("model") != model:
        raise ApiError(404, f"The model `{body.get('model')}` does not exist; this gateway serves `{model}` "
                            f"(OMRL_MODEL)", param="model", code="model_not_found")
    noop = NOOP if noop is None else noop
    for name, value in body.items():
        if name in honoured or name in ignored:
            continue
        if name in noop:
            default, why = noop[name]
            if value is None or value == default:
                continue
            raise unsupported(name, f"{name}={json.dumps(value)[:80]}: {why}")
        raise ApiError(400, f"Unrecognized request argument supplied to {route}: {name}", param=name,
                       code="unknown_parameter")
    return body


def text_of(content: Any, where: str, parts: dict[str, str]) -> str:
    """A message's text: a string, or a list of parts whose types are the keys of ``parts`` (each mapped to the
    field that holds its text), joined; any other part is a 400 naming it (``where[j]``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of {' / '.join(parts)} parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get(parts[kind]) if kind in parts else None
        if not isinstance(text, str):
            got = f"type {kind!r}" if kind not in parts else f"a {kind} part without its {parts[kind]}"
            raise ApiError(400, f"{where}[{j}]: only text parts ({', '.join(parts)}) are served here, got {got}"[:300],
                           param=f"{where}[{j}]")
        texts.append(text)
    return "".join(texts)


def number(body: dict, name: str, kind: type, default: Any, low: float | None = None,
           high: float | None = None, param: str | None = None) -> Any:
    value = body.get(name)
    param = param or name
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ApiError(400, f"{param} must be {'an integer' if kind is int else 'a number'}, got {value!r}",
                       param=param)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ApiError(400, f"{param}={value!r} is out of range [{low}, {high}]", param=param)
    return kind(value)


def flag(body: dict, name: str, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{param or name} must be true or false, got {value!r}", param=param or name)
    return value


def check_tools(tools: Any, param: str = "tools") -> list | None:
    """Chat-completions function tools (``{"type": "function", "function": {"name": ..., ...}}``), as given."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, f"{param} must be a list of function tools", param=param)
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise ApiError(400, f"{param}[{i}]: only function tools are served, got type {kind!r}"[:300],
                           param=f"{param}[{i}]")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{param}[{i}].function needs a name", param=f"{param}[{i}]")
    return tools or None


def check_tool_choice(choice: Any, tools: list | None, param: str = "tool_choice") -> str | dict | None:
    """``tool_choice`` in chat-completions' shape; a named function must be one of ``tools``."""
    if choice is None:
        return None
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise ApiError(400, f"{param}='required' needs tools", param=param)
        return choice
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, f"{param} must be 'none', 'auto', 'required' or a function to call, got "
                            f"{json.dumps(choice)[:120]}", param=param)
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise ApiError(400, f"{param} names the function {name!r}, which is not among the tools {names}",
                       param=param)
    return {"type": "function", "function": {"name": name}}


def check_response_format(fmt: Any, param: str) -> dict | None:
    """``response_format`` in chat-completions' shape (the schema itself is checked where the constraint is
    built)."""
    if fmt is None:
        return None
    read = _RESPONSE_FORMATS.get(fmt.get("type") if isinstance(fmt, dict) else None)
    if read is None:
        *rest, last = _RESPONSE_FORMATS
        raise ApiError(400, f"{param} must be of type {', '.join(rest)} or {last}, got {json.dumps(fmt)[:120]}",
                       param=param)
    return read(fmt, param)


def _json_schema_format(fmt: dict, param: str) -> dict:
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ApiError(400, f"{param}.json_schema must be an object with a schema object", param=param)
    return {"type": "json_schema", "json_schema": spec}


_RESPONSE_FORMATS: dict[str, Callable[[dict, str], dict]] = {
    "text": lambda fmt, param: {"type": "text"},
    "json_object": lambda fmt, param: {"type": "json_object"},
    "json_schema": _json_schema_format}
"""``response_format`` types served, each read (and checked) by its function."""


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
        out["tool_calls"] = [template_call(c, f"messages[{i}]") for c in calls]
    return out


def template_call(call: Any, where: str) -> dict:
    """A chat-completions tool call with its arguments as a mapping, as chat templates render them."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"{where}.tool_calls: each needs a function with a name", param=where)
    args = fn.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        raise ApiError(400, f"{where}.tool_calls: arguments are not JSON: {args!r}"[:300], param=where) from None
    return {**call, "function": {"name": fn["name"], "arguments": args}}
