"""The gateway: the policy behind an OpenAI-compatible HTTP endpoint that records every token it produces.

Routes (all under ``/v1``, on 127.0.0.1 unless told otherwise):

- ``POST /v1/chat/completions``: ``messages`` (text contents, ``tool_calls`` and ``tool`` replies as the model's chat
  template renders them), ``tools``, ``n``, ``temperature``, ``top_p``, ``max_tokens`` (or
  ``max_completion_tokens``), ``stop`` (left out of the reply unless ``include_stop_str_in_output``, as vLLM's
  server does), ``logprobs``, ``stream`` (the whole reply as one chunk, then ``[DONE]``);
- ``GET /v1/models``: the policy, under one name;
- ``POST /v1/rl/reward`` with ``{"reward": x}`` (and optionally ``"success": true``): the episode's reward.

Every request carries an API key (``Authorization: Bearer <key>``). Each episode gets its own key from
:meth:`Gateway.open_episode` and the key names the episode, so an unmodified client that reads ``OPENAI_API_KEY``
works: every call it makes is recorded under its episode (:class:`Call`: the prompt's token ids as the chat template
renders them, the completion's ids and log-probs, the policy version that produced them). Any other key gets 401, a
model other than the policy's name 404, a malformed request 400, each in OpenAI's error shape.

Sampling: in training (``sampling`` given) the run's settings are used whatever the request asks, so the recorded
log-probs are those of the policy the trainer corrects for; in ``openmanus-rl serve`` (``sampling=None``) the
request's ``temperature``, ``top_p`` and ``max_tokens`` are honoured. Concurrent requests are batched: the requests
that arrive within ``batch_wait_s`` of each other go to the engine in ONE ``generate`` call.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

from openmanus_rl_core.gateway.requests import ApiError, ChatRequest
from openmanus_rl_core.gateway.tools import parse_tool_calls
from openmanus_rl_core.protocols import SamplingParams


@dataclass
class Call:
    """One chat completion as the policy produced it: the rendered prompt's ids, the completion's ids and their
    log-probs (aligned), the policy version of the weights that sampled them, and the reply's text."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int
    text: str
    finish_reason: str
    last_message: str = ""  # the text of the conversation's last message: what this reply answers


@dataclass
class EpisodeRecord:
    """What the gateway recorded under one key: the task, every call in order, the posted reward and success
    (None: not posted)."""

    key: str
    task: dict
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    success: bool | None = None
    sampling: SamplingParams | None = None  # how its calls are sampled (None: as the gateway's default says)


class _Batcher:
    """One thread that owns the engine: the requests of one batch (with the same sampling settings) go to
    ``engine.generate`` together. In a run (``running()``: how many agents run now) a batch closes once every running
    agent has asked, or when no request has come for ``wait_s`` (the others are busy with their envs). Serving
    (``running()`` 0), it closes at a gap of ``wait_s``, at most ``10 * wait_s`` after its first request."""

    def __init__(self, engine: Any, lock: Any, version: Callable[[], int], wait_s: float,
                 running: Callable[[], int] = lambda: 0):
        self.engine, self.lock, self.version, self.wait_s, self.running = engine, lock, version, wait_s, running
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="omrl-gateway-batcher", daemon=True)
        self.thread.start()

    def submit(self, prompts: list[list[int]], params: SamplingParams) -> Future:
        fut: Future = Future()
        self.queue.put((prompts, params, fut))
        return fut

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            pending = self._batch(item)
            by_params: dict[Any, list] = {}
            for prompts, params, fut in pending:
                key = (params.max_new_tokens, params.temperature, params.top_p, params.top_k, tuple(params.stop),
                       params.greedy)
                by_params.setdefault(key, []).append((prompts, params, fut))
            for group in by_params.values():
                self._generate(group)

    def _batch(self, first: tuple) -> list:
        # Requests of one turn arrive spread over milliseconds (each client's own work, one core for them all): in a
        # run, wait for every running agent (one request each); a gap of wait_s means the rest are elsewhere.
        pending, expected = [first], self.running()
        deadline = time.monotonic() + 10 * self.wait_s
        while not expected or len(pending) < expected:
            left = self.wait_s if expected else min(self.wait_s, deadline - time.monotonic())
            if left <= 0:
                break
            try:
                more = self.queue.get(timeout=left)
            except queue.Empty:
                break
            if more is None:
                self.queue.put(None)  # close after this batch
                break
            pending.append(more)
            expected = self.running()
        return pending

    def _generate(self, group: list) -> None:
        flat = [p for prompts, _, _ in group for p in prompts]
        try:
            with self.lock:
                version = int(self.version())
                outs = self.engine.generate(flat, group[0][1])
        except Exception as exc:  # the engine failed: every waiting request gets it
            for _, _, fut in group:
                fut.set_exception(exc)
            return
        i = 0
        for prompts, _, fut in group:
            fut.set_result((outs[i:i + len(prompts)], version))
            i += len(prompts)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every agent of a step may connect at once; the default backlog of 5 refuses them


class Gateway:
    """The HTTP server over one rollout engine (see the module doc).

    ``engine``: a :class:`~openmanus_rl_core.protocols.RolloutEngine`; ``tokenizer``: its tokenizer, whose chat
    template renders the messages; ``model``: the name ``/v1/models`` lists; ``sampling``: the run's sampling
    settings (None: the request's, as ``serve`` does); ``version``: the policy version of the engine's weights now;
    ``lock``: held around each ``generate`` (the worker's engine lock); ``keys``: keys accepted besides the
    episodes' (``serve``'s own).
    """

    def __init__(self, engine: Any, tokenizer: Any, model: str, sampling: SamplingParams | None = None,
                 version: Callable[[], int] = lambda: 0, lock: Any = None, host: str = "127.0.0.1", port: int = 0,
                 batch_wait_s: float = 0.005, keys: Sequence[str] = (), max_new_tokens: int = 512):
        self.tokenizer, self.model, self.sampling = tokenizer, model, sampling
        self.max_new_tokens = max_new_tokens
        self.episodes: dict[str, EpisodeRecord] = {}
        self.static_keys = set(keys)
        self._lock = threading.Lock()
        self.running: set[str] = set()  # the keys whose agents run now (agent_running)
        self.batcher = _Batcher(engine, lock if lock is not None else threading.Lock(), version, batch_wait_s,
                                running=lambda: len(self.running))
        self.server = _Server((host, port), _handler(self))
        self._thread = threading.Thread(target=self.server.serve_forever, name="omrl-gateway", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``: what ``OPENAI_BASE_URL`` is set to."""
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def open_episode(self, task: dict, sampling: SamplingParams | None = None) -> str:
        """A new key; the calls made with it are recorded under ``task`` and sampled as ``sampling`` says (None:
        as ``self.sampling``)."""
        key = "omrl-" + secrets.token_hex(16)
        with self._lock:
            self.episodes[key] = EpisodeRecord(key=key, task=dict(task), sampling=sampling)
        return key

    def close_episode(self, key: str) -> EpisodeRecord:
        """The episode's record; its key is refused from now on."""
        with self._lock:
            self.running.discard(key)
            return self.episodes.pop(key)

    def agent_running(self, key: str, running: bool) -> None:
        """Whether the agent of episode ``key`` runs now: a batch waits for every running agent's request."""
        with self._lock:
            (self.running.add if running else self.running.discard)(key)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.batcher.close()

    # ------------------------------------------------------------------------------------------- requests
    def record(self, key: str | None) -> EpisodeRecord | None:
        """The episode ``key`` names (None for an accepted static key); :class:`ApiError` 401 for any other."""
        with self._lock:
            if key in self.episodes:
                return self.episodes[key]
        if key is not None and key in self.static_keys:
            return None
        raise ApiError(401, "Incorrect API key provided. Each episode's key is in its OPENAI_API_KEY.",
                       code="invalid_api_key")

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                            "owned_by": "openmanus-rl"}]}

    def set_reward(self, record: EpisodeRecord | None, body: Any) -> dict:
        reward = body.get("reward") if isinstance(body, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise ApiError(400, f"reward must be a number, got {reward!r}", param="reward")
        success = body.get("success")
        if success is not None and not isinstance(success, bool):
            raise ApiError(400, f"success must be true or false, got {success!r}", param="success")
        if record is None:
            raise ApiError(400, "this key names no episode: a reward needs an episode's key")
        record.reward, record.success = float(reward), success
        return {"ok": True, "reward": record.reward, "success": record.success}

    def chat(self, record: EpisodeRecord | None, body: Any) -> dict:
        """One ``/v1/chat/completions`` request: rendered, generated (batched with others), recorded."""
        req = ChatRequest.parse(body, self.model)
        prompt = self.render(req.messages, req.tools)
        params = self._params(req, record.sampling if record is not None and record.sampling else self.sampling)
        outs, version = self.batcher.submit([prompt] * req.n, params).result()
        choices = []
        for i, out in enumerate(outs):
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            call = Call(list(prompt), list(out.token_ids), [float(x) for x in out.logprobs], version, text,
                        out.finish_reason, last_message=req.messages[-1]["content"])
            if record is not None:
                with self._lock:
                    record.calls.append(call)
            choices.append(self._choice(i, call, req))
        completion = sum(len(o.token_ids) for o in outs)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                          "total_tokens": len(prompt) + completion}}

    def render(self, messages: list[dict], tools: list | None) -> list[int]:
        """The prompt's token ids, as the model's chat template renders the conversation (and tools)."""
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as exc:  # a template that cannot render this conversation: the client's to fix
            raise ApiError(400, f"the model's chat template cannot render these messages: {exc}",
                           param="messages") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _params(self, req: "ChatRequest", sampling: SamplingParams | None) -> SamplingParams:
        if sampling is not None:  # training: the run's sampling, the request's stop strings and length cap
            cap = min(sampling.max_new_tokens, req.max_tokens or sampling.max_new_tokens)
            return replace(sampling, max_new_tokens=cap, stop=list(sampling.stop) + req.stop)
        temperature = 1.0 if req.temperature is None else req.temperature
        return SamplingParams(max_new_tokens=req.max_tokens or self.max_new_tokens, temperature=temperature or 1.0,
                              top_p=1.0 if req.top_p is None else req.top_p, stop=req.stop,
                              greedy=temperature == 0)

    def _choice(self, index: int, call: Call, req: "ChatRequest") -> dict:
        text = call.text
        ended = next((s for s in req.stop if text.endswith(s)), None)
        if ended and not req.include_stop:  # OpenAI's way: the stop string is not part of the reply
            text = text[:-len(ended)]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = call.finish_reason
        if req.tools:
            content, tool_calls = parse_tool_calls(text)
            if tool_calls:
                message = {"role": "assistant", "content": content or None, "tool_calls": tool_calls}
                finish = "tool_calls"
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
        if req.logprobs:
            tokens = [self.tokenizer.decode([t]) for t in call.completion_ids]
            choice["logprobs"] = {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                                               "top_logprobs": []} for tok, lp in zip(tokens, call.logprobs)]}
        else:
            choice["logprobs"] = None
        return choice


def _handler(gateway: Gateway) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # the run's console is not an access log
            pass

        def _key(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return auth[7:].strip() if auth.startswith("Bearer ") else None

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, result: dict) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for choice in result["choices"]:
                delta = {k: v for k, v in choice["message"].items() if v is not None}
                if "tool_calls" in delta:
                    delta["tool_calls"] = [dict(c, index=j) for j, c in enumerate(delta["tool_calls"])]
                chunk = {"id": result["id"], "object": "chat.completion.chunk", "created": result["created"],
                         "model": result["model"], "choices": [{"index": choice["index"], "delta": delta,
                                                                 "logprobs": choice["logprobs"],
                                                                 "finish_reason": choice["finish_reason"]}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def _serve(self, work: Callable[[EpisodeRecord | None, Any], dict], needs_body: bool) -> None:
            try:
                record = gateway.record(self._key())
                body = None
                if needs_body:
                    length = int(self.headers.get("Content-Length") or 0)
                    try:
                        body = json.loads(self.rfile.read(length) or b"null")
                    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                        raise ApiError(400, f"the request body is not JSON: {exc}") from None
                result = work(record, body)
                if isinstance(body, dict) and body.get("stream"):
                    self._stream(result)
                else:
                    self._send(200, result)
            except ApiError as err:
                self._send(err.status, err.body())
            except Exception as exc:  # the engine failed: the client sees a server error, the run goes on
                self._send(500, ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error").body())

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._serve(lambda record, body: gateway.models(), needs_body=False)
            else:
                self._send(404, ApiError(404, f"no route {self.path}").body())

        def do_POST(self) -> None:
            routes = {"/v1/chat/completions": gateway.chat, "/v1/rl/reward": gateway.set_reward}
            work = routes.get(self.path.rstrip("/"))
            if work is None:
                self._send(404, ApiError(404, f"no route {self.path}").body())
            else:
                self._serve(work, needs_body=True)

    return Handler
