"""``openai``: a rollout engine that asks a model served behind an OpenAI-compatible HTTP API (vLLM's or SGLang's
server, TGI, a hosted API) for its replies. For ``rollout`` and ``eval`` only: it holds no weights and is given no
token log-probabilities, so ``train`` refuses it (``trainable = False``).

    openmanus-rl rollout env=key_door model.path=exported/ rollout.engine=openai \\
        rollout.engine_kwargs.base_url=http://127.0.0.1:8000/v1 rollout.engine_kwargs.model=NAME

Requests, per prompt of a :meth:`OpenAIEngine.generate` call (at most ``max_concurrency`` in flight):

- ``api=completions``: ``POST {base_url}/completions`` with the prompt's token ids (``prompt_as=ids``: exactly the
  tokens the rollout built; vLLM and SGLang accept them) or their decoding (``prompt_as=text``);
- ``api=chat``: ``POST {base_url}/chat/completions`` with the chat messages recovered from the prompt by the run's
  chat template (:class:`ChatSplit`), for servers that only speak chat.

Sampling: ``temperature`` (0 when greedy), ``top_p``, ``max_tokens = max_new_tokens``, ``stop``, and ``top_k`` when
it is set (a vLLM / SGLang extension). ``extra_body`` is merged into every request (e.g. ``{"seed": 1}``).

The reply: an OpenAI server leaves the matched stop string out of the text; the project keeps it (templates parse
``...</action>``), so it is put back: the one the server names (vLLM's ``stop_reason``, SGLang's ``matched_stop``),
else, when the request had a single stop string and the server names none, that one. ``token_ids`` are the reply's
tokens under the run's tokenizer (``tokenizer.encode(text)``) and ``logprobs`` are 0: the trajectories then have the
layout the other engines give, and nobody trains on them.

Faults: each request has a whole-request deadline ``timeout_s`` (also for a body that trickles in and never ends);
connection failures, timeouts, HTTP 408/409/429/5xx are retried ``max_retries`` times with exponential backoff
(``backoff_s * 2**attempt``, or the server's ``Retry-After`` up to ``max_backoff_s``). What retrying cannot fix (a 4xx,
an answer that is not JSON or has no choice) raises :class:`ServedModelError`: one line with the URL and the reason.
At construction ``GET {base_url}/models`` must answer within ``connect_timeout_s`` (and list ``model`` when it lists
names); a server that does not answer raises :class:`~openmanus_rl_core.engines.EngineUnavailableError` naming the URL,
so the command ends before any episode runs.

The API key: ``api_key_env`` names an environment variable; its value is read here, sent only as the
``Authorization`` header, and kept out of every message, log, ``repr`` and saved config (the config holds the
variable's name).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from openmanus_rl_core.engines import EngineUnavailableError, check_prompts
from openmanus_rl_core.protocols import Generation, SamplingParams

__all__ = ["OpenAIEngine", "ServedModelError", "ChatSplit"]

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


# How a completions request carries the prompt: ``prompt_as`` -> (tokenizer, token ids) -> the body's ``prompt``.
PROMPT_FORMS: dict[str, Callable[[Any, Sequence[int]], Any]] = {
    "ids": lambda tokenizer, prompt: [int(t) for t in prompt],
    "text": lambda tokenizer, prompt: tokenizer.decode(list(prompt), skip_special_tokens=False),
}


class ServedModelError(EngineUnavailableError):
    """A request the served model could not answer usefully (after retries where retrying can help)."""


class _Retry(Exception):
    """A failure worth another attempt; ``wait`` is the server's Retry-After, when it gave one."""

    def __init__(self, reason: str, wait: float | None = None):
        super().__init__(reason)
        self.wait = wait


class ChatSplit:
    """Chat messages back from a prompt the run's chat template rendered (``api=chat``).

    The template's pieces are found once by rendering dummy contents (as :class:`~openmanus_rl_core.rollout.ChatDelta`
    does): the text before the system message, the separator before a user message and the one before an assistant
    message (which also ends a prompt that asks for a reply). A prompt is split at those separators.
    """

    _S, _U, _A, _V = "OMRLsysS", "OMRLuserU", "OMRLasstA", "OMRLuserV"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        msgs = [("system", self._S), ("user", self._U), ("assistant", self._A), ("user", self._V)]
        full = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in msgs], tokenize=False,
                                             add_generation_prompt=True)
        if any(full.count(c) != 1 for _, c in msgs):
            raise ValueError("api=chat: the run's chat template does not render message contents verbatim; "
                             "use api=completions")
        at = {c: full.index(c) for _, c in msgs}
        self.head = full[: at[self._S]]
        self.before_user = full[at[self._S] + len(self._S): at[self._U]]
        self.before_assistant = full[at[self._U] + len(self._U): at[self._A]]
        if (full[at[self._A] + len(self._A): at[self._V]] != self.before_user
                or full[at[self._V] + len(self._V):] != self.before_assistant):
            raise ValueError("api=chat: the run's chat template puts different text around turns of the same role; "
                             "use api=completions")

    def messages(self, prompt_ids: Sequence[int]) -> list[dict[str, str]]:
        """The messages of a prompt that ends with the assistant header (``[system, user, (assistant, user)*]``)."""
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        start = text.find(self.head) if self.head else 0
        if start < 0 or not text.endswith(self.before_assistant):
            raise ServedModelError("api=chat: the prompt does not have the run's chat template's layout; "
                                   "use api=completions")
        body = text[start + len(self.head): len(text) - len(self.before_assistant)]
        out, role = [], "system"
        while True:
            cuts = [(body.find(sep), sep, r) for sep, r in ((self.before_user, "user"),
                                                            (self.before_assistant, "assistant")) if sep]
            cuts = [c for c in cuts if c[0] >= 0]
            if not cuts:
                out.append({"role": role, "content": body})
                return out
            at, sep, nxt = min(cuts)
            out.append({"role": role, "content": body[:at]})
            body, role = body[at + len(sep):], nxt


class OpenAIEngine:
    """Replies from an OpenAI-compatible server; implements ``protocols.RolloutEngine`` (see the module doc).

    ``base_url``: the API root (``http://host:8000/v1``); ``model``: the served model's name; ``api_key_env``: the
    name of the environment variable holding the key (null: no key); ``tokenizer``: the run's tokenizer (prompt
    decoding, reply token ids). ``seed`` and ``device`` are accepted for the common engine call and unused.
    ``settings_key``: where these settings live in the config, for the messages (a memory's writing engine sets
    its own).
    """

    trainable = False  # no weights here and no log-probs guaranteed: `train` refuses this engine
    needs_model = False  # rollout and eval load only the tokenizer

    def __init__(self, base_url: str, model: str, tokenizer: Any, api_key_env: str | None = None,
                 api: str = "completions", prompt_as: str = "ids", max_concurrency: int = 8, timeout_s: float = 120.0,
                 connect_timeout_s: float = 5.0, max_retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, extra_body: dict | None = None, check_server: bool = True,
                 seed: int = 0, device: Any = None, settings_key: str = "rollout.engine_kwargs"):
        from openmanus_rl_core.config import ConfigError

        where = self.settings_key = settings_key
        if api not in ("completions", "chat"):
            raise ConfigError(f"{where}.api={api}: must be completions or chat")
        if prompt_as not in PROMPT_FORMS:
            raise ConfigError(f"{where}.prompt_as={prompt_as}: must be ids or text")
        for key, value, low in (("max_concurrency", max_concurrency, 1), ("max_retries", max_retries, 0)):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{where}.{key}={value}: must be an integer >= {low}")
        for key, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if not value > 0:
                raise ConfigError(f"{where}.{key}={value}: must be > 0")
        if not str(base_url or "").startswith(("http://", "https://")):
            raise ConfigError(f"{where}.base_url={base_url}: must be an http:// or https:// URL such as "
                              f"http://127.0.0.1:8000/v1")
        self._key = None
        if api_key_env:
            self._key = os.environ.get(str(api_key_env)) or None
            if self._key is None:
                raise ConfigError(f"{where}.api_key_env={api_key_env}: the environment variable {api_key_env} is not "
                                  f"set (export it, or set api_key_env=null for a server without a key)")
        self.base_url = str(base_url).rstrip("/")
        self.model_name = str(model)
        self.tokenizer = tokenizer
        self.api, self.prompt_as = api, prompt_as
        self.max_concurrency = int(max_concurrency)
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.max_retries, self.backoff_s, self.max_backoff_s = int(max_retries), float(backoff_s), float(max_backoff_s)
        self.extra_body = dict(extra_body or {})
        self.chat = ChatSplit(tokenizer) if api == "chat" and tokenizer is not None else None
        self.url = f"{self.base_url}/{'chat/completions' if api == 'chat' else 'completions'}"
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="omrl-served")
        self.calls = 0
        self.stats = {"requests": 0, "retries": 0}
        if check_server:
            self.check_server()

    @classmethod
    def preflight(cls, **kwargs: Any) -> None:
        """The settings and the server, checked before a command loads its tokenizer, tasks or envs: a stopped
        server ends the command within ``connect_timeout_s`` of its start (``engines.preflight``)."""
        cls(tokenizer=None, **kwargs).close()

    def __repr__(self) -> str:  # never the key
        return f"OpenAIEngine(base_url={self.base_url!r}, model={self.model_name!r}, api={self.api!r})"

    # ------------------------------------------------------------------------------------------------ http
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def check_server(self) -> None:
        """``GET {base_url}/models`` within ``connect_timeout_s``; raises naming the URL when nothing answers, the
        key is refused, or the listed models lack ``model``."""
        url = f"{self.base_url}/models"
        try:
            r = self._session().get(url, headers=self._headers(), timeout=self.connect_timeout_s)
        except requests.RequestException as exc:
            raise EngineUnavailableError(f"the served model at {self.base_url} does not answer ({_reason(exc)}); "
                                         f"start the server or fix {self.settings_key}.base_url") from None
        if r.status_code in (401, 403):
            raise EngineUnavailableError(f"the served model at {self.base_url} refused the request (HTTP "
                                         f"{r.status_code}); check the key in {self.settings_key}.api_key_env")
        if r.status_code != 200:
            return  # some servers have no model listing; the first request tells
        try:
            names = [str(m.get("id")) for m in r.json().get("data", [])]
        except (ValueError, AttributeError):
            return
        if names and self.model_name not in names:
            raise EngineUnavailableError(f"the server at {self.base_url} does not serve model {self.model_name!r}; it "
                                         f"serves {', '.join(names)} (set {self.settings_key}.model)")

    def _post(self, body: Mapping[str, Any]) -> dict:
        """One request with retries; the parsed JSON answer."""
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                return self._attempt(body)
            except _Retry as exc:
                last = str(exc)
                if attempt == self.max_retries:
                    break
                self.stats["retries"] += 1
                wait = self.backoff_s * 2 ** attempt * (1 + 0.1 * random.random())
                if exc.wait is not None:
                    wait = exc.wait
                time.sleep(min(wait, self.max_backoff_s))
        raise ServedModelError(f"{self.url}: no answer after {self.max_retries + 1} attempts; the last: {last}")

    def _attempt(self, body: Mapping[str, Any]) -> dict:
        self.stats["requests"] += 1
        deadline = time.monotonic() + self.timeout_s
        try:
            r = self._session().post(self.url, data=json.dumps(body), headers=self._headers(), stream=True,
                                     timeout=(self.connect_timeout_s, self.timeout_s))
            with r:
                raw = self._read(r, deadline)
        except requests.RequestException as exc:
            raise _Retry(_reason(exc)) from None
        if r.status_code in RETRY_STATUS:
            raise _Retry(f"HTTP {r.status_code}: {_snippet(raw)}", _retry_after(r.headers.get("Retry-After")))
        if r.status_code != 200:
            raise ServedModelError(f"{self.url}: HTTP {r.status_code}: {_snippet(raw)}")
        try:
            answer = json.loads(raw)
        except ValueError:
            raise ServedModelError(f"{self.url}: the answer is not JSON: {_snippet(raw)}") from None
        if not isinstance(answer, dict):
            raise ServedModelError(f"{self.url}: the answer is not a JSON object: {_snippet(raw)}")
        return answer

    def _read(self, r: requests.Response, deadline: float) -> bytes:
        """The whole body, or a timeout at ``deadline`` (a body that keeps trickling in is cut there too)."""
        chunks = []
        while True:
            if time.monotonic() > deadline:
                raise requests.Timeout(f"the answer took longer than timeout_s={self.timeout_s:g}s")
            chunk = r.raw.read1(65536, decode_content=True)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    # ---------------------------------------------------------------------------------------- generation
    def _body(self, prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        greedy = bool(params.greedy) or params.temperature is None or params.temperature <= 0
        body: dict[str, Any] = {"model": self.model_name, "max_tokens": int(params.max_new_tokens),
                                "temperature": 0.0 if greedy else float(params.temperature),
                                "top_p": 1.0 if greedy else float(params.top_p), "n": 1}
        if params.top_k and not greedy:
            body["top_k"] = int(params.top_k)
        stops = [s for s in (params.stop or []) if s]
        if stops:
            body["stop"] = stops
        if self.chat is not None:
            body["messages"] = self.chat.messages(prompt)
        else:
            body["prompt"] = PROMPT_FORMS[self.prompt_as](self.tokenizer, prompt)
        body.update(self.extra_body)
        return body

    def _one(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        answer = self._post(self._body(prompt, params))
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise ServedModelError(f"{self.url}: the answer has no choice: {_snippet(json.dumps(answer))}")
        choice = choices[0]
        text = choice.get("message", {}).get("content") if self.chat is not None else choice.get("text")
        if text is None and self.chat is not None:
            text = ""  # a chat reply with no content (e.g. only a refusal): an empty reply, which the loop ends
        if not isinstance(text, str):
            raise ServedModelError(f"{self.url}: the choice has no text: {_snippet(json.dumps(choice))}")
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        stops = [s for s in (params.stop or []) if s]
        if reason == "stop" and stops and not any(text.endswith(s) for s in stops):
            named = choice.get("stop_reason", choice.get("matched_stop", ...))
            if isinstance(named, str) and named in stops:
                text += named
            elif named is ... and len(stops) == 1:  # the server does not say which; one was asked for
                text += stops[0]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason=reason)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None) -> list[Generation]:
        """One :class:`Generation` per prompt, in order; at most ``max_concurrency`` requests at a time."""
        params = params or SamplingParams()
        self.calls += 1
        if not prompts:
            return []
        check_prompts(prompts, "OpenAIEngine")
        return list(self._pool.map(lambda p: self._one(p, params), prompts))

    def update_weights(self, state_dict: dict[str, Any]) -> None:
        raise ServedModelError("the openai engine serves a remote model; its weights cannot be updated from here")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _reason(exc: BaseException) -> str:
    """A short reason for a failed request, without the request's headers."""
    kind = ("connection refused or reset" if isinstance(exc, requests.ConnectionError)
            and not isinstance(exc, requests.Timeout) else "timed out" if isinstance(exc, requests.Timeout)
            else type(exc).__name__)
    detail = str(exc.args[0]) if exc.args and isinstance(exc.args[0], str) else ""
    return f"{kind}: {detail[:160]}" if detail else kind


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _snippet(raw: bytes | str, n: int = 200) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    text = " ".join(text.split())
    return text[:n] + ("..." if len(text) > n else "")
