"""``openai``: replies from a model served behind an OpenAI-compatible API (vLLM, SGLang, TGI, a hosted API), asked
through the ``openai`` SDK, for ``rollout`` and ``eval`` (no weights, no log-probs). The SDK retries (waiting out
``Retry-After``), backs off and times out; this module adds a deadline on each whole attempt, the start-up check of
the server, the stop string put back, and one-line errors naming the URL. Settings and faults: docs/served-models.md.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

import httpx

from openmanus_rl_core.engines import EngineUnavailableError, check_prompts
from openmanus_rl_core.protocols import Generation, SamplingParams
from openmanus_rl_core.rollout.chat import ChatSplit

__all__ = ["OpenAIEngine", "ServedModelError"]

# How a completions request carries the prompt: ``prompt_as`` -> (tokenizer, token ids) -> the body's ``prompt``.
PROMPT_FORMS: dict[str, Callable[[Any, Sequence[int]], Any]] = {
    "ids": lambda tokenizer, prompt: [int(t) for t in prompt],
    "text": lambda tokenizer, prompt: tokenizer.decode(list(prompt), skip_special_tokens=False),
}


class ServedModelError(EngineUnavailableError):
    """A request the served model could not answer usefully (after retries where retrying can help)."""


class OpenAIEngine:
    """Replies from an OpenAI-compatible server (``protocols.RolloutEngine``); ``settings_key`` names where these
    settings live, for the messages. Each request carries a ``seed`` of its own, drawn from a generator seeded with
    ``seed``: a server that honours it (vLLM, SGLang, TGI) samples a run's replies again alike. Unused: ``backoff_s``
    (the SDK backs off 0.5 s doubling to 8 s) and ``device`` (the common engine call)."""

    decodes_constraints = False  # a served model is asked for free text: SamplingParams.constraint is not sent


    trainable = False  # no weights here and no log-probs guaranteed: `train` refuses this engine
    needs_model = False  # rollout and eval load only the tokenizer

    def __init__(self, base_url: str, model: str, tokenizer: Any, api_key_env: str | None = None,
                 api: str = "completions", prompt_as: str = "ids", max_concurrency: int = 8, timeout_s: float = 120.0,
                 connect_timeout_s: float = 5.0, max_retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, extra_body: dict | None = None, check_server: bool = True,
                 seed: int = 0, device: Any = None, settings_key: str = "rollout.engine_kwargs"):
        from openmanus_rl_core.config import ConfigError

        self._key = os.environ.get(str(api_key_env)) or None if api_key_env else None
        for wrong, line in ((api not in ("completions", "chat"), f"api={api}: must be completions or chat"),
                            (prompt_as not in PROMPT_FORMS, f"prompt_as={prompt_as}: must be ids or text"),
                            (type(max_concurrency) is not int or max_concurrency < 1,
                             f"max_concurrency={max_concurrency}: must be an integer >= 1"),
                            (type(max_retries) is not int or max_retries < 0,
                             f"max_retries={max_retries}: must be an integer >= 0"),
                            (not timeout_s > 0, f"timeout_s={timeout_s}: must be > 0"),
                            (not connect_timeout_s > 0, f"connect_timeout_s={connect_timeout_s}: must be > 0"),
                            (not str(base_url or "").startswith(("http://", "https://")), f"base_url={base_url}: "
                             f"must be an http:// or https:// URL such as http://127.0.0.1:8000/v1"),
                            (api_key_env and not self._key, f"api_key_env={api_key_env}: the environment variable "
                             f"{api_key_env} is not set (export it, or set api_key_env=null for a server without "
                             f"a key)")):
            if wrong:
                raise ConfigError(f"{settings_key}.{line}")
        self.base_url, self.model_name, self.tokenizer, self.api = str(base_url).rstrip("/"), str(model), tokenizer, api
        self.prompt_as, self.extra_body, self.settings_key = prompt_as, dict(extra_body or {}), settings_key
        self.max_retries, self.max_backoff_s, self.timeout_s = max_retries, float(max_backoff_s), float(timeout_s)
        self.timeout = httpx.Timeout(self.timeout_s, connect=float(connect_timeout_s))
        self.chat = ChatSplit(tokenizer) if api == "chat" and tokenizer is not None else None
        self.url = f"{self.base_url}/{'chat/completions' if api == 'chat' else 'completions'}"
        self.calls, self.stats, self.seeds = 0, {"requests": 0, "retries": 0}, random.Random(seed)
        # A client per thread, each with a pool of its own (one pool shared by many concurrent requests costs time
        # quadratic in them), all on one TLS context (making one costs ~20 ms).
        self._tls, self._local, self._clients = httpx.create_ssl_context(), threading.local(), []
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="omrl-served")
        if check_server:
            self.check_server()

    @classmethod
    def preflight(cls, **kwargs: Any) -> None:
        """The settings and the server, checked before a command loads anything (``engines.preflight``)."""
        cls(tokenizer=None, **kwargs).close()

    def __repr__(self) -> str:  # never the key
        return f"OpenAIEngine(base_url={self.base_url!r}, model={self.model_name!r}, api={self.api!r})"

    def _client(self) -> Any:
        import openai  # here, not at the top: a command whose server is down ends before it (0.7 s to import)

        if not hasattr(self._local, "client"):
            hooks = {"request": [self._on_request], "response": [self._on_response]}
            self._local.client = openai.OpenAI(
                base_url=self.base_url, api_key=self._key or "none", max_retries=self.max_retries, timeout=self.timeout,
                http_client=openai.DefaultHttpxClient(verify=self._tls, event_hooks=hooks))
            self._clients.append(self._local.client)
        return self._local.client

    def _on_request(self, request: httpx.Request) -> None:
        self.stats["requests"] += 1
        self.stats["retries"] += request.headers.get("x-stainless-retry-count", "0") != "0"
        request.extensions["omrl_deadline"] = time.monotonic() + self.timeout_s
        if not self._key:  # no Authorization at all (the SDK would send its placeholder, or OPENAI_ADMIN_KEY)
            request.headers.pop("Authorization", None)

    def _on_response(self, response: httpx.Response) -> None:
        wait = response.headers.get("retry-after", "")  # the SDK waits up to 2 minutes, and gives up past that
        if wait.replace(".", "", 1).isdigit():
            response.headers["retry-after"] = f"{min(float(wait), self.max_backoff_s):g}"
        # httpx's timeouts bound each read: a body trickling in would never end, so the attempt's deadline cuts it.
        deadline = response.request.extensions["omrl_deadline"]
        response.stream = httpx.ByteStream(b"".join(_until(response.stream, deadline)))

    def check_server(self) -> None:
        """``GET {base_url}/models`` within ``connect_timeout_s``: raises naming the URL when nothing answers, the
        key is refused, or the models listed lack ``model``."""
        at, where = self.base_url, self.settings_key
        try:
            r = httpx.get(f"{at}/models", headers={"Authorization": f"Bearer {self._key}"} if self._key else {},
                          timeout=self.timeout.connect, verify=self._tls, follow_redirects=True)
        except httpx.TransportError as exc:
            raise EngineUnavailableError(f"the served model at {at} does not answer ({_reason(exc)}); start the "
                                         f"server or fix {where}.base_url") from None
        if r.status_code in (401, 403):
            raise EngineUnavailableError(f"the served model at {at} refused the request (HTTP {r.status_code}); "
                                         f"check the key in {where}.api_key_env")
        try:
            names = [str(m.get("id")) for m in r.json().get("data", [])] if r.status_code == 200 else []
        except (ValueError, AttributeError):  # some servers list no models: their first request tells
            return
        if names and self.model_name not in names:
            raise EngineUnavailableError(f"the server at {at} does not serve model {self.model_name!r}; it serves "
                                         f"{', '.join(names)} (set {where}.model)")

    def _one(self, prompt: Sequence[int], params: SamplingParams, seed: int) -> Generation:
        greedy = bool(params.greedy) or params.temperature is None or params.temperature <= 0
        stops = [s for s in (params.stop or []) if s]
        body = {"model": self.model_name, "max_tokens": int(params.max_new_tokens), "n": 1, "stop": stops or None,
                "temperature": 0.0 if greedy else float(params.temperature),
                "top_p": 1.0 if greedy else float(params.top_p),
                "top_k": None if greedy else params.top_k or None,  # top_k: a vLLM / SGLang extension, when set
                "seed": seed}
        if self.chat:
            body["messages"] = self.chat.messages(prompt)
        else:
            body["prompt"] = PROMPT_FORMS[self.prompt_as](self.tokenizer, prompt)
        choice = self._post({**{k: v for k, v in body.items() if v is not None}, **self.extra_body})
        text = (choice.get("message") or {}).get("content") or "" if self.chat else choice.get("text")
        if not isinstance(text, str):  # a chat reply with no content (only a refusal) is an empty one: the loop ends
            raise ServedModelError(f"{self.url}: the choice has no text: {_snippet(json.dumps(choice))}")
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        if reason == "stop" and stops and not any(text.endswith(s) for s in stops):
            named = choice.get("stop_reason", choice.get("matched_stop", ...))  # null or a token id: end-of-text
            if isinstance(named, str) and named in stops:
                text += named
            elif named is ... and len(stops) == 1:  # the server does not say which; one was asked for
                text += stops[0]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason=reason)

    def _post(self, body: dict[str, Any]) -> dict:
        """The first choice of the answer to one request (retried by the SDK where retrying can help)."""
        import openai

        try:
            raw = self._client().post(self.url, body=body, cast_to=httpx.Response).text
            answer = json.loads(raw)
        except openai.APIStatusError as exc:
            last = f"HTTP {exc.status_code}: {_snippet(exc.response.text)}"
            if exc.status_code < 500 and exc.status_code not in (408, 409, 429):  # the SDK did not retry it
                raise ServedModelError(f"{self.url}: {last}") from None
        except openai.APIConnectionError as exc:  # timeouts included
            last = _reason(exc)
        except ValueError:
            raise ServedModelError(f"{self.url}: the answer is not JSON: {_snippet(raw)}") from None
        else:
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                raise ServedModelError(f"{self.url}: the answer has no choice: {_snippet(raw)}")
            return choices[0]
        raise ServedModelError(f"{self.url}: no answer after {self.max_retries + 1} attempts; the last: {last}")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None) -> list[Generation]:
        """One :class:`Generation` per prompt, in order; at most ``max_concurrency`` requests at a time."""
        params, self.calls = params or SamplingParams(), self.calls + 1
        if prompts:
            check_prompts(prompts, "OpenAIEngine")
        seeds = [self.seeds.randrange(2 ** 31) for _ in prompts]  # drawn in order: the same run, the same seeds
        return list(self._pool.map(lambda p, s: self._one(p, params, s), prompts, seeds))

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        raise ServedModelError("the openai engine serves a remote model; its weights cannot be updated from here")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self._clients:
            client.close()


def _until(stream: httpx.SyncByteStream, deadline: float) -> Iterator[bytes]:
    with closing(stream):
        for chunk in stream:
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the answer took longer than timeout_s")
            yield chunk


def _reason(exc: BaseException) -> str:
    """What failed, from the httpx error (under the SDK's, if any), without the request's headers."""
    cause = exc.__cause__ if isinstance(exc.__cause__, httpx.HTTPError) else exc
    kind = "timed out" if isinstance(cause, httpx.TimeoutException) else "connection refused or reset"
    detail = str(cause)[:160]
    return f"{kind}: {detail}" if detail not in ("", kind) else kind


def _snippet(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text[:n] + ("..." if len(text) > n else "")
