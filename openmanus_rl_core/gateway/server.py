"""The gateway: the policy behind an OpenAI-compatible HTTP endpoint that records every token it produces.

Routes (all under ``/v1``, on 127.0.0.1 unless told otherwise; gateway/app.py serves them, docs/gateway.md lists
every field each one honours, ignores or refuses):

- ``POST /v1/chat/completions``: ``messages`` (text contents, ``tool_calls`` and ``tool`` replies as the model's chat
  template renders them), ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``, ``n``,
  ``temperature``, ``top_p``, ``max_tokens`` (or ``max_completion_tokens``), ``stop`` (left out of the reply unless
  ``include_stop_str_in_output``, as vLLM's server does), ``logprobs``, ``stream`` (server-sent chunks as the reply
  is generated where the engine can, keep-alive comments where it cannot: gateway/sse.py; a usage chunk when
  ``stream_options.include_usage``);
- ``POST /v1/responses`` (the Responses API, gateway/responses.py) and ``POST /v1/messages`` (Anthropic's Messages
  API, gateway/messages.py): translated into the same chat request, so their calls are batched and recorded alike;
- ``GET /v1/models`` and ``GET /v1/models/{id}``: the policy, under one name;
- ``POST /v1/rl/reward`` with ``{"reward": x}`` (and optionally ``"success": true``): the episode's reward. A
  second post with another value is refused (409, naming the reward already posted); the same value again is
  answered as the first was, so a client's retry is harmless.

Every request carries an API key (``Authorization: Bearer <key>``, or ``x-api-key``). Each episode gets its own key
from :meth:`Gateway.open_episode` and the key names the episode, so an unmodified client that reads
``OPENAI_API_KEY`` works: every call it makes is recorded under its episode (:class:`Call`: the prompt's token ids
as the chat template renders them, the completion's ids and log-probs, the policy version that produced them). Any
other key gets 401, a model other than the policy's name 404, a malformed request 400, each in OpenAI's error
shape. With ``max_context_tokens``, a prompt of that many tokens or more gets OpenAI's 400
``context_length_exceeded``, and a reply is cut where the context is full.

Sampling: in training (``sampling`` given) the run's settings are used whatever the request asks, so the recorded
log-probs are those of the policy the trainer corrects for; in ``openmanus-rl serve`` (``sampling=None``) the
request's ``temperature``, ``top_p``, ``top_k`` (vLLM's extra field) and ``max_tokens`` are honoured. Concurrent
requests are batched: the requests that arrive within ``batch_wait_s`` of each other go to the engine in ONE
``generate`` call.
"""

from __future__ import annotations

import asyncio
import queue
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Sequence

from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall
from openai.types.completion_usage import CompletionUsage

from openmanus_rl_core.engines.constrained import ToolCallFormat
from openmanus_rl_core.gateway.episodes import prompt_for
from openmanus_rl_core.gateway.records import Call, EpisodeRecord
from openmanus_rl_core.gateway.requests import ApiError, ChatRequest
from openmanus_rl_core.gateway.sse import Feed, Live, LiveText
from openmanus_rl_core.gateway.structured import request_constraint, tools_in_prompt
from openmanus_rl_core.gateway.tools import ChatRenderer, reply_text
from openmanus_rl_core.protocols import SamplingParams


@dataclass
class Reply:
    """One completion as a client reads it: ``text`` (its stop string left out unless asked for), the ``content``
    outside reasoning and tool calls, the ``tool_calls`` (OpenAI's shape, arguments as JSON strings), ``finish``
    (``stop``, ``length`` or ``tool_calls``), the stop string that ended it and the ``reasoning`` (the family's
    reasoning parser's: a ``<think>`` block's text; None when there was none)."""

    call: Call
    text: str
    content: str
    tool_calls: list[dict]
    finish: str
    stop_sequence: str | None
    reasoning: str | None = None


@dataclass
class Generated:
    """The answer to one :class:`ChatRequest`: its prompt's ids and one :class:`Reply` per choice."""

    prompt_ids: list[int]
    replies: list[Reply]

    @property
    def completion_tokens(self) -> int:
        return sum(len(r.call.completion_ids) for r in self.replies)


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

    def submit(self, prompts: list[list[int]], params: SamplingParams, feed: Feed | None = None) -> Future:
        """``feed``: told the prompts' tokens as they are generated, if the engine can (gateway/sse.py)."""
        fut: Future = Future()
        self.queue.put((prompts, params, fut, feed))
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
            for item in pending:
                params = item[1]
                # Rows of one generate call may have different constraints (one per row), not different sampling.
                key = (params.max_new_tokens, params.temperature, params.top_p, params.top_k, tuple(params.stop),
                       params.greedy)
                by_params.setdefault(key, []).append(item)
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
        flat = [p for prompts, _, _, _ in group for p in prompts]
        params = group[0][1]
        if any(getattr(p, "constraint", None) is not None for _, p, _, _ in group):
            rows = []
            for prompts, p, _, _ in group:
                c = p.constraint
                rows.extend(c if isinstance(c, list) else [c] * len(prompts))
            params = replace(params, constraint=rows)
        # Each row's streamed request and choice (None: nobody streams it), when the engine tells tokens as it goes.
        owners = [feed and (feed, j) for prompts, _, _, feed in group for j in range(len(prompts))]
        tell = {"on_tokens": partial(Feed.tell, owners)} if any(owners) else {}
        if not getattr(self.engine, "streams_tokens", False):
            tell = {}  # an engine that cannot: its streams get keep-alives, then the finished reply
        try:
            with self.lock:
                version = int(self.version())
                outs = self.engine.generate(flat, params, **tell)
        except Exception as exc:  # the engine failed: every waiting request gets it
            for _, _, fut, feed in group:
                fut.set_exception(exc)
                if feed is not None:
                    feed.close()
            return
        i = 0
        for prompts, _, fut, feed in group:
            fut.set_result((outs[i:i + len(prompts)], version))
            i += len(prompts)
            if feed is not None:
                feed.close()


def model_positions(engine: Any) -> int | None:
    """The longest context ``engine``'s model takes (vLLM's ``max_model_len``, a transformers model's
    ``max_position_embeddings``); None when the engine does not say (a served model)."""
    limit = getattr(engine, "max_model_len", None)
    if limit is None:
        limit = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
    return int(limit) if limit else None


class Gateway:
    """The HTTP server over one rollout engine (see the module doc).

    ``engine``: a :class:`~openmanus_rl_core.protocols.RolloutEngine`; ``tokenizer``: its tokenizer, whose chat
    template renders the messages; ``model``: the name ``/v1/models`` lists; ``sampling``: the run's sampling
    settings (None: the request's, as ``serve`` does); ``version``: the policy version of the engine's weights now;
    ``lock``: held around each ``generate`` (the worker's engine lock); ``keys``: keys accepted besides the
    episodes' (``serve``'s own); ``max_context_tokens``: the longest context (prompt and reply) the policy is given
    (None: no limit); ``chat``: how conversations become prompts and replies are read (the model family's tool-call
    and reasoning parsers; default: found from the chat template); ``constrained``: honour ``tool_choice`` and
    ``response_format`` by grammar-constrained decoding (gateway/structured.py).
    """

    # Responses kept for previous_response_id under a static key (serve), oldest dropped first; an episode keeps
    # its own until it closes.
    SERVED_RESPONSES = 1024
    # Seconds between the ": keep-alive" comments of a stream that has nothing to send yet (gateway/sse.py).
    keepalive_s = 5.0

    def __init__(self, engine: Any, tokenizer: Any, model: str, sampling: SamplingParams | None = None,
                 version: Callable[[], int] = lambda: 0, lock: Any = None, host: str = "127.0.0.1", port: int = 0,
                 batch_wait_s: float = 0.005, keys: Sequence[str] = (), max_new_tokens: int = 512,
                 max_context_tokens: int | None = None, chat: ChatRenderer | None = None, constrained: bool = True):
        from openmanus_rl_core.gateway.app import Listener

        self.tokenizer, self.model, self.sampling = tokenizer, model, sampling
        self.renderer = chat if chat is not None else ChatRenderer(tokenizer)
        self.constrained = constrained
        fmt = self.renderer.tool_parser.call_format  # None: a family whose calls a JSON grammar cannot write
        self.tool_format = ToolCallFormat(**fmt) if fmt is not None else None
        self.max_new_tokens, self.max_context_tokens = max_new_tokens, max_context_tokens
        self.episodes: dict[str, EpisodeRecord] = {}
        self.static_keys = set(keys)
        self.served_responses: OrderedDict[str, list[dict]] = OrderedDict()
        self._lock = threading.Lock()
        self.running: set[str] = set()  # the keys whose agents run now (agent_running)
        self.batcher = _Batcher(engine, lock if lock is not None else threading.Lock(), version, batch_wait_s,
                                running=lambda: len(self.running))
        try:
            self.server = Listener(self, host, port)
        except BaseException:
            self.batcher.close()
            raise

    @property
    def address(self) -> tuple[str, int]:
        """The ``(host, port)`` the gateway listens on."""
        return self.server.address

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``: what ``OPENAI_BASE_URL`` is set to."""
        host, port = self.address
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
        self.server.close()
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
        return {"object": "list", "data": [self.model_card(self.model)]}

    def model_card(self, model_id: str) -> dict:
        """``GET /v1/models/{id}``: the policy's card; 404 for any other name."""
        if model_id != self.model:
            raise ApiError(404, f"The model `{model_id}` does not exist; this gateway serves `{self.model}` "
                                f"(OMRL_MODEL)", param="model", code="model_not_found")
        return Model(id=self.model, object="model", created=0, owned_by="openmanus-rl").model_dump()

    def set_reward(self, record: EpisodeRecord | None, body: Any) -> dict:
        reward = body.get("reward") if isinstance(body, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise ApiError(400, f"reward must be a number, got {reward!r}", param="reward")
        success = body.get("success")
        if success is not None and not isinstance(success, bool):
            raise ApiError(400, f"success must be true or false, got {success!r}", param="success")
        if record is None:
            raise ApiError(400, "this key names no episode: a reward needs an episode's key")
        with self._lock:
            if record.reward is not None and (record.reward, record.success) != (float(reward), success):
                # One reward per episode: a second, different one is a bug in the agent, not a correction to guess.
                raise ApiError(409, f"this episode's reward is already {record.reward!r} (success "
                                    f"{record.success!r}); a second post of {reward!r} is refused",
                               param="reward", code="reward_already_set")
            record.reward, record.success = float(reward), success
        return {"ok": True, "reward": record.reward, "success": record.success}

    def chat(self, record: EpisodeRecord | None, body: Any) -> dict:
        """One ``/v1/chat/completions`` request, answered synchronously (the HTTP route awaits :meth:`generate`)."""
        req = ChatRequest.parse(body, self.model)
        prompt, params, bridged = self.prepare(record, req)
        outs, version = self.batcher.submit([prompt] * req.n, params).result()
        generated = self.finish(record, req, prompt, outs, version, bridged)
        return self.chat_completion(req, generated).model_dump(mode="json", exclude_unset=True)

    async def generate(self, record: EpisodeRecord | None, req: ChatRequest) -> Generated:
        """Render, generate (batched with others: the engine's thread does it, this awaits), record."""
        prompt, params, bridged = self.prepare(record, req)
        return await self._generated(record, req, prompt, params, bridged)

    async def _generated(self, record: EpisodeRecord | None, req: ChatRequest, prompt: list[int],
                         params: SamplingParams, bridged: bool, feed: Feed | None = None) -> Generated:
        outs, version = await asyncio.wrap_future(self.batcher.submit([prompt] * req.n, params, feed))
        return self.finish(record, req, prompt, outs, version, bridged)

    def start(self, record: EpisodeRecord | None, req: ChatRequest) -> Live:
        """A streamed request under way (gateway/sse.py): refused here, before its stream begins, if it must be
        (:meth:`prepare`); recorded when generated, whether or not its client still reads."""
        prompt, params, bridged = self.prepare(record, req)
        feed = Feed(req.n)
        task = asyncio.ensure_future(self._generated(record, req, prompt, params, bridged, feed))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure nobody read is no log noise
        hold = bool(req.tools) and tools_in_prompt(req.tool_choice)  # a tool parser must see the whole reply
        stops = [] if req.include_stop else req.stop  # left out of the reply: never sent live
        texts = [LiveText(self.renderer.reasoning_parser, hold, stops) for _ in range(req.n)]
        return Live(feed, task, texts, lambda ids: reply_text(self.tokenizer, ids), len(prompt), self.keepalive_s)

    def prepare(self, record: EpisodeRecord | None, req: ChatRequest) -> tuple[list[int], SamplingParams, bool]:
        """The prompt's ids (continuing the episode's recorded tokens where the template re-rendered its history:
        gateway/episodes.py), how to sample its replies (constrained as ``tool_choice`` and ``response_format``
        ask), and whether the prompt was bridged; 400 ``context_length_exceeded`` for a prompt that leaves no room
        for one token."""
        tools = req.tools if tools_in_prompt(req.tool_choice) else None  # tool_choice=none: no tools shown
        try:
            prompt = prompt_for(record, req.messages, tools, self.renderer)
        except Exception as exc:  # a template that cannot render this conversation: the client's to fix
            raise ApiError(400, f"the model's chat template cannot render these messages: {exc}",
                           param="messages") from None
        params = self._params(req, record.sampling if record is not None and record.sampling else self.sampling)
        if self.constrained:
            constraint = self._constraint(req)
            if constraint is not None:
                params = replace(params, constraint=constraint)
        limit = self.max_context_tokens
        if limit is not None:
            if len(prompt.ids) >= limit:
                raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your messages "
                                    f"resulted in {len(prompt.ids)} tokens. Please reduce the length of the "
                                    f"messages.", param="messages", code="context_length_exceeded")
            if len(prompt.ids) + params.max_new_tokens > limit:
                params = replace(params, max_new_tokens=limit - len(prompt.ids))
        return prompt.ids, params, prompt.bridged

    def _constraint(self, req: ChatRequest) -> Any:
        """The grammar a reply must follow (None: free text). A family whose calls a JSON grammar cannot write
        (``call_format`` None) gets its tool calls unconstrained, said once."""
        wants_call = req.tools and (req.tool_choice == "required" or isinstance(req.tool_choice, dict))
        if wants_call and self.tool_format is None:
            if not getattr(self, "_told_unconstrained", False):
                self._told_unconstrained = True
                self.renderer.notice(f"tool_choice={req.tool_choice!r}: the {self.renderer.tool_parser.name} call "
                                     f"format has no grammar here; its tool calls are not constrained (told once)")
            return request_constraint(response_format=req.response_format)
        return request_constraint(tools=req.tools, tool_choice=req.tool_choice, response_format=req.response_format,
                                  parallel_tool_calls=req.parallel_tool_calls, tool_format=self.tool_format)

    def finish(self, record: EpisodeRecord | None, req: ChatRequest, prompt: list[int], outs: list,
               version: int, bridged: bool = False) -> Generated:
        """Each generation as a recorded :class:`Call` and the :class:`Reply` a client reads."""
        replies = []
        for out in outs:
            text = reply_text(self.tokenizer, out.token_ids)  # special tokens kept: some families' call markers
            call = Call(list(prompt), list(out.token_ids), [float(x) for x in out.logprobs], version, text,
                        out.finish_reason, last_message=req.messages[-1]["content"], messages=req.messages,
                        tools=req.tools, bridged=bridged)
            if record is not None:
                with self._lock:
                    record.calls.append(call)
            replies.append(self.reply(call, req))
        return Generated(list(prompt), replies)

    def reply(self, call: Call, req: ChatRequest) -> Reply:
        """How the client reads ``call``: stop string, tool calls, finish reason."""
        text = call.text
        ended = next((s for s in req.stop if text.endswith(s)), None) if call.finish_reason == "stop" else None
        if ended and not req.include_stop:  # OpenAI's way: the stop string is not part of the reply
            text = text[:-len(ended)]
        reasoning, content = self.renderer.reasoning_parser.split(text)
        tool_calls, finish = [], call.finish_reason
        if req.tools and tools_in_prompt(req.tool_choice):
            rest, calls = self.renderer.tool_parser.parse(content, req.tools)
            if calls:
                content, tool_calls, finish = rest, calls, "tool_calls"
        return Reply(call, text, content, tool_calls, finish, ended, reasoning)

    def render(self, messages: list[dict], tools: list | None) -> list[int]:
        """The prompt's token ids, as the model's chat template renders the conversation (tools reaching the model
        either way: gateway/tools.py)."""
        try:
            return self.renderer.ids(messages, tools)
        except Exception as exc:  # a template that cannot render this conversation: the client's to fix
            raise ApiError(400, f"the model's chat template cannot render these messages: {exc}",
                           param="messages") from None

    def chat_completion(self, req: ChatRequest, generated: Generated) -> ChatCompletion:
        choices = [self._choice(i, reply, req) for i, reply in enumerate(generated.replies)]
        prompt, completion = len(generated.prompt_ids), generated.completion_tokens
        return ChatCompletion(id=f"chatcmpl-{uuid.uuid4().hex}", object="chat.completion", created=int(time.time()),
                              model=self.model, choices=choices,
                              usage=CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                                                    total_tokens=prompt + completion))

    def _params(self, req: ChatRequest, sampling: SamplingParams | None) -> SamplingParams:
        if sampling is not None:  # training: the run's sampling, the request's stop strings and length cap
            cap = min(sampling.max_new_tokens, req.max_tokens or sampling.max_new_tokens)
            return replace(sampling, max_new_tokens=cap, stop=list(sampling.stop) + req.stop)
        temperature = 1.0 if req.temperature is None else req.temperature
        return SamplingParams(max_new_tokens=req.max_tokens or self.max_new_tokens, temperature=temperature or 1.0,
                              top_p=1.0 if req.top_p is None else req.top_p, top_k=max(req.top_k or 0, 0),
                              stop=req.stop,
                              greedy=temperature == 0)

    def _choice(self, index: int, reply: Reply, req: ChatRequest) -> Choice:
        if reply.tool_calls:
            calls = [ChatCompletionMessageFunctionToolCall(**c) for c in reply.tool_calls]
            message = ChatCompletionMessage(role="assistant", content=reply.content or None, tool_calls=calls)
        else:
            message = ChatCompletionMessage(role="assistant", content=reply.content)
        if reply.reasoning is not None:  # vLLM's and DeepSeek's field for it
            message.reasoning_content = reply.reasoning  # type: ignore[attr-defined]
        logprobs = None
        if req.logprobs:
            call = reply.call
            tokens = [self.tokenizer.decode([t]) for t in call.completion_ids]
            logprobs = ChoiceLogprobs(content=[
                ChatCompletionTokenLogprob(token=tok, logprob=lp, bytes=list(tok.encode()), top_logprobs=[])
                for tok, lp in zip(tokens, call.logprobs)])
        return Choice(index=index, message=message, finish_reason=reply.finish, logprobs=logprobs)
