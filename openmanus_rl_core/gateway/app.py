"""The gateway's HTTP stack: a Starlette app (its routes, the key each request carries, refusals in the API's own
error shape) served by uvicorn on a loop of its own in a background thread (:class:`Listener`).

uvicorn reads every request body to its end, answered or not, so a keep-alive connection survives any refusal
(404, 401, 400, 405): the next request on it is parsed from its own bytes. A handler never blocks the loop on the
engine: it awaits the batcher's future (the engine's own thread runs ``generate``). Streams are server-sent events,
sent as the reply is generated where the engine can and keep-alive comments where it cannot (gateway/sse.py), and
the connection stays open after them.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from openmanus_rl_core.gateway.requests import ApiError, ChatRequest
from openmanus_rl_core.gateway.sse import KEEPALIVE, Live, LiveText, sse

# (method, path) of every route served, as the 404 for any other lists them.
ROUTES = (("GET", "/v1/models"), ("GET", "/v1/models/{model_id}"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/responses"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"),
          ("POST", "/v1/rl/reward"))
SERVED = ", ".join(f"{m} {p}" for m, p in ROUTES)


def _json(body: Any, status: int = 200) -> Response:
    if hasattr(body, "model_dump_json"):  # one of the openai package's types, as set (no field it left unset)
        return Response(body.model_dump_json(exclude_unset=True), status, media_type="application/json")
    return Response(json.dumps(body), status, media_type="application/json")


def _stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.startswith("Bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")  # Anthropic's SDK sends its key here


async def _body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}") from None


def build_app(gateway: Any) -> Starlette:
    """The routes of :data:`ROUTES` over ``gateway`` (a :class:`~openmanus_rl_core.gateway.server.Gateway`)."""
    from openmanus_rl_core.gateway import messages, responses

    def endpoint(work: Callable[[Request, Any], Awaitable[Response]], anthropic: bool = False) -> Callable:
        async def handle(request: Request) -> Response:
            try:
                record = gateway.record(_key(request))
                return await work(request, record)
            except ApiError as err:
                return _json(err.anthropic_body() if anthropic else err.body(), err.status)
            except Exception as exc:  # the engine failed: the client sees a server error, the run goes on
                err = ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error")
                return _json(err.anthropic_body() if anthropic else err.body(), 500)
        return handle

    async def models(request: Request, record: Any) -> Response:
        return _json(gateway.models())

    async def model(request: Request, record: Any) -> Response:
        return _json(gateway.model_card(request.path_params["model_id"]))

    # A stream is started (gateway.start: refused here if it must be) before its response begins.
    async def chat(request: Request, record: Any) -> Response:
        req = ChatRequest.parse(await _body(request), gateway.model)
        if req.stream:
            return _stream(chat_stream(gateway, req, gateway.start(record, req)))
        return _json(gateway.chat_completion(req, await gateway.generate(record, req)))

    async def respond(request: Request, record: Any) -> Response:
        call = responses.parse(await _body(request), gateway, record)
        if call.stream:
            return _stream(responses.stream(call, gateway.start(record, call.chat), gateway, record))
        return _json(responses.build(call, await gateway.generate(record, call.chat), gateway, record))

    async def message(request: Request, record: Any) -> Response:
        call = messages.parse(await _body(request), gateway.model)
        if call.stream:
            return _stream(messages.stream(call, gateway.start(record, call.chat), gateway.model))
        return _json(messages.build(call, await gateway.generate(record, call.chat), gateway.model))

    async def count(request: Request, record: Any) -> Response:
        chat = messages.parse(await _body(request), gateway.model, counting=True).chat
        return _json({"input_tokens": len(gateway.render(chat.messages, chat.tools))})

    async def reward(request: Request, record: Any) -> Response:
        return _json(gateway.set_reward(record, await _body(request)))

    handlers = {"/v1/models": endpoint(models), "/v1/models/{model_id}": endpoint(model),
                "/v1/chat/completions": endpoint(chat), "/v1/responses": endpoint(respond),
                "/v1/messages": endpoint(message, anthropic=True),
                "/v1/messages/count_tokens": endpoint(count, anthropic=True), "/v1/rl/reward": endpoint(reward)}
    # Each path also with a trailing slash, answered as without (no redirect a client would have to follow).
    routes = [Route(p + tail, handlers[p], methods=[m]) for m, p in ROUTES for tail in ("", "/")]

    async def refused(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 405:
            allowed = exc.headers.get("Allow", "") if exc.headers else ""
            err = ApiError(405, f"{request.method} is not allowed on {request.url.path} (allowed: {allowed}); this "
                                f"gateway serves {SERVED}")
        elif exc.status_code == 404:
            err = ApiError(404, f"no route {request.method} {request.url.path}; this gateway serves {SERVED}",
                           code="unknown_url")
        else:
            err = ApiError(exc.status_code, str(exc.detail))
        return _json(err.body(), err.status)

    return Starlette(routes=routes, exception_handlers={HTTPException: refused})


async def chat_stream(gateway: Any, req: ChatRequest, live: Live) -> AsyncIterator[bytes]:
    """A chat completion streamed while it is generated (gateway/sse.py): keep-alives while nothing is new, each
    choice's live deltas (``content``; ``reasoning_content``, whole, when its block closes), then
    :func:`chat_chunks` of the finished completion with what did not go out live."""
    from openai.types.chat import ChatCompletionChunk

    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": gateway.model}
    named: set[int] = set()  # the choices whose role was sent (in their first chunk)
    async for item in live.events():
        if item is None:
            yield KEEPALIVE
            continue
        choice, kind, text = item
        delta = {"reasoning_content" if kind == "reasoning" else "content": text}
        if choice not in named:
            named.add(choice)
            delta = {"role": "assistant", **delta}
        part = {"index": choice, "delta": delta, "logprobs": None, "finish_reason": None}
        yield sse(ChatCompletionChunk.model_validate(dict(head, choices=[part])).model_dump_json(exclude_unset=True))
    try:
        generated = await live.result()
    except Exception as exc:  # the engine failed: the stream ends on an error, which the SDK raises
        yield sse({"error": ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error").body()["error"]})
        return
    completion = gateway.chat_completion(req, generated)
    for chunk in chat_chunks(completion.model_copy(update={"id": head["id"], "created": head["created"]}), req,
                             live.texts):
        yield chunk


def chat_chunks(completion: Any, req: ChatRequest, live: list[LiveText] | None = None) -> list[bytes]:
    """A finished chat completion as the chunks a stream of it sends: per choice, its delta then its finish; the
    usage last when ``stream_options.include_usage``; then ``[DONE]``. ``live``: what of each choice went out live
    (its delta then carries only the rest, and no role)."""
    from openai.types.chat import ChatCompletionChunk

    head = {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
            "model": completion.model}
    out = []
    for choice in completion.choices:
        message, text = choice.message, live[choice.index] if live else None
        reasoning = getattr(message, "reasoning_content", None)
        delta: dict[str, Any] = {"role": "assistant", "content": message.content}
        if text is not None and text.went_live:
            delta = {"content": text.rest(message.content or "")}
        if reasoning is not None and (text is None or text.thought is None):
            delta["reasoning_content"] = reasoning
        if message.tool_calls:
            delta["tool_calls"] = [dict(call.model_dump(), index=j) for j, call in enumerate(message.tool_calls)]
        logprobs = choice.logprobs.model_dump() if choice.logprobs is not None else None
        for part in ({"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": None},
                     {"index": choice.index, "delta": {}, "logprobs": None, "finish_reason": choice.finish_reason}):
            chunk = ChatCompletionChunk.model_validate(dict(head, choices=[part]))
            out.append(sse(chunk.model_dump_json(exclude_unset=True)))
    if req.include_usage:
        chunk = ChatCompletionChunk.model_validate(dict(head, choices=[], usage=completion.usage.model_dump()))
        out.append(sse(chunk.model_dump_json(exclude_unset=True)))
    out.append(b"data: [DONE]\n\n")
    return out


class Listener:
    """uvicorn serving :func:`build_app` on ``host:port`` (0: a free port) from a thread of its own, with no
    signal handlers (the process's own stay in place). The socket is bound before the thread starts, so a port in
    use fails here, in the caller."""

    def __init__(self, gateway: Any, host: str, port: int):
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self.address: tuple[str, int] = sock.getsockname()[:2]
        # Every agent of a step may connect at once; uvicorn's own logging setup would replace the process's.
        config = uvicorn.Config(build_app(gateway), log_config=None, access_log=False, lifespan="off",
                                backlog=2048, timeout_graceful_shutdown=5)
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        self.server = uvicorn.Server(config)
        self._sock = sock
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, name="omrl-gateway", daemon=True)
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            self._thread.join(0.005)
        if not self.server.started:
            raise RuntimeError(f"the gateway did not start on {host}:{port}: {self._failed or 'no reason given'}")

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as exc:  # reported by the constructor while it waits for the start
            self._failed.append(exc)

    def close(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()
