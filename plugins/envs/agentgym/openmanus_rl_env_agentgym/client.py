"""HTTP client for AgentGym environment servers (FastAPI apps, one per environment family).

One :class:`AgentGymEnv` is one episode's env: ``reset`` creates a server-side env on first use (POST /create)
and starts a task (POST /reset), ``step`` sends one action (POST /step), ``close`` releases it (POST /close, only
where the server has it: the spec's ``has_close``, or by default the server's own OpenAPI schema,
``GET /openapi.json``, read once per server and process). What differs between servers -- the request shape, body keys, where the observation
is, whether the reward is per step or a running score -- comes from the spec table ``envs.yaml``
(:mod:`openmanus_rl_env_agentgym.spec`), never from code that branches on env names.

Request shapes (``protocol``):

- ``id``: ``POST /create -> {"id": n, ...}``; ``POST /reset {"id": n, "<index key>": i}``;
  ``POST /step {"id": n, "action": a} -> {"observation", "reward", "done", ...}``; ``GET /observation?id=n``.
- ``env_idx``: ``POST /create -> n`` (a bare int); ``POST /reset {"env_idx": n, "<index key>": i}``;
  ``POST /step {"env_idx": n, "action": a}``; ``GET /observation?env_idx=n``.

Errors. AgentGym servers report failures as HTTP 200 with ``{"error": "..."}``. That, a refused connection, a
timeout, an answer that is not JSON or lacks the expected field, and any non-2xx status all raise ONE exception
type, :class:`EnvServerError`, whose message names the env, the URL and the cause. **This env is the one kind
allowed to raise from** ``step``: an HTTP env can lose its server mid-episode, and the core rollout catches
``EnvServerError`` and ends that episode with termination ``env_error``. Text the env does not understand is
still answered by the server with an observation, not an error. After an error the server-side env is
considered lost; the next ``reset`` creates a fresh one.

Limits. Each attempt of a request has a total deadline of ``timeout`` seconds (a body trickled in slowly does not
extend it), and an answer longer than ``max_response_bytes`` or nested deeper than ``max_json_depth`` raises
:class:`EnvServerError`. Flags are read strictly: ``done`` must be a JSON boolean (``0``/``1`` and the strings
``"true"``/``"false"`` are read as such); anything else raises.

Retries. A request that never reached the server (connection refused, connect timeout) and HTTP 503 are retried
``retries`` times with exponential backoff; a read timeout or a dropped connection is not, since the server may
have applied the step.

Threads. The rollout runs many envs' ``step`` calls concurrently in a thread pool and may call one instance from
different threads over an episode (and ``close`` while an abandoned ``step`` is still in flight). Each thread
gets its own ``requests.Session`` per instance (Sessions are not thread-safe); ``close`` closes all of them.
Use one instance per episode; calls on one instance must not overlap except for ``close``.

Rewards. ``StepResult.reward`` is per step: servers that report a running score (``reward_cumulative`` in the
spec) are turned into differences. ``info["score"]`` is the episode's score so far (the sum of step rewards);
``info["success"]`` is ``done and score >= success_threshold`` where the spec gives a threshold.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import string
import threading
import time
from typing import Any, Mapping

import requests
import urllib3

from openmanus_rl_core.protocols import StepResult

from .spec import EnvSpec, get_spec

__all__ = ["AgentGymEnv", "EnvServerError"]

log = logging.getLogger(__name__)

_MAX_SHOWN = 300  # characters of a bad answer quoted in an error message
_CHUNK = 65536  # bytes read from a response per call
_FLAGS = {"true": True, "false": False}

# base URL + prefix -> whether the server's OpenAPI schema lists POST {prefix}/close (one GET per server)
_CLOSE_SCHEMA: dict[str, bool] = {}
_CLOSE_SCHEMA_LOCK = threading.Lock()


class EnvServerError(RuntimeError):
    """An AgentGym env server failed: unreachable, timed out, answered garbage, an error body or an HTTP error.

    ``str(err)`` names the env, the URL and the cause; the parts are also attributes.
    """

    def __init__(self, message: str, *, env_name: str | None = None, url: str | None = None,
                 cause: BaseException | str | None = None):
        self.message = message
        self.env_name = env_name
        self.url = url
        self.cause = cause
        where = " ".join(p for p in (f"AgentGym env {env_name!r}" if env_name else "", f"at {url}" if url else "") if p)
        text = f"{where}: {message}" if where else message
        if cause is not None and str(cause) and str(cause) not in message:
            text += f" (cause: {type(cause).__name__ + ': ' if isinstance(cause, BaseException) else ''}{cause})"
        super().__init__(text)

    def __reduce__(self) -> tuple:
        # Picklable (Ray ships exceptions between processes); the cause travels as text.
        cause = None if self.cause is None else f"{type(self.cause).__name__}: {self.cause}" \
            if isinstance(self.cause, BaseException) else str(self.cause)
        return _restore_error, (str(self), self.message, self.env_name, self.url, cause)


def _restore_error(text: str, message: str, env_name: str | None, url: str | None,
                   cause: str | None) -> EnvServerError:
    err = EnvServerError.__new__(EnvServerError)
    RuntimeError.__init__(err, text)
    err.message, err.env_name, err.url, err.cause = message, env_name, url, cause
    return err


def _never_sent(exc: BaseException) -> bool:
    """True when the request cannot have reached the server, so retrying it cannot apply an action twice."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(exc, requests.exceptions.ConnectionError):
        inner = exc.args[0] if exc.args else None
        reason = getattr(inner, "reason", inner)
        return isinstance(reason, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError))
    return False


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + f"... ({len(text)} chars)"


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, default=str)


class _Fields(dict):
    """Template fields of an answer: lists joined with ", "; ``{key?}`` is empty when the key is missing."""

    def __missing__(self, key: str) -> str:
        if key.endswith("?"):
            return self.get(key[:-1], "")
        raise KeyError(key)


class AgentGymEnv:
    """An :class:`~openmanus_rl_core.protocols.Env` backed by an AgentGym env server.

    Args:
        env_name: an AgentGym env name in ``envs.yaml`` (``textcraft``, ``webshop``, ...).
        base_url: the server root, e.g. ``http://127.0.0.1:36001`` (a trailing env prefix such as ``/maze`` is
            accepted). Default: ``http://{host}:{port}``.
        port: server port when ``base_url`` is not given (default: the spec's ``default_port``).
        host: server host when ``base_url`` is not given.
        protocol: ``"id"`` or ``"env_idx"``; default: the env's own request shape from the spec.
        timeout: seconds to wait for an answer: the total deadline of each attempt of a request, headers and body.
        retries: extra attempts for requests that never reached the server, and for HTTP 503.
        connect_timeout: seconds to wait for a TCP connection.
        retry_backoff: first retry delay in seconds; doubles per attempt.
        data_range: ``[start, end)`` of valid data indices, overriding the spec's.
        spec: further spec field overrides (see ``envs.yaml``), e.g. ``{"reward_cumulative": True}``.
        trust_env: let requests read proxy settings from the environment (off: env servers are usually local
            and a proxy variable would swallow the requests).
        max_response_bytes: a longer answer raises :class:`EnvServerError`.
        max_json_depth: an answer nested deeper raises :class:`EnvServerError`.

    Attributes: ``instruction`` (task family and action syntax), ``num_tasks`` (size of the data range),
    ``spec``, ``base_url``.
    """

    def __init__(
        self,
        env_name: str,
        base_url: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        protocol: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
        *,
        connect_timeout: float = 5.0,
        retry_backoff: float = 0.25,
        data_range: tuple[int, int] | list[int] | None = None,
        spec: Mapping[str, Any] | None = None,
        trust_env: bool = False,
        max_response_bytes: int = 16 << 20,
        max_json_depth: int = 64,
    ):
        overrides = dict(spec or {})
        if data_range is not None:
            overrides["data_range"] = list(data_range)
        self.spec: EnvSpec = get_spec(env_name, protocol, overrides)
        self.env_name = env_name
        if base_url is not None and port is not None:
            raise ValueError(f"AgentGym env {env_name!r}: give base_url or port, not both (got {base_url!r}, {port!r})")
        if base_url is None:
            base_url = f"http://{host}:{int(port) if port is not None else self.spec.default_port}"
        root = str(base_url).rstrip("/")
        if "://" not in root:
            raise ValueError(f"AgentGym env {env_name!r}: base_url {base_url!r} needs a scheme, e.g. http://{root}")
        if self.spec.prefix and root.endswith(self.spec.prefix):
            root = root[: -len(self.spec.prefix)]  # AgentGym users often pass http://host:port/maze/
        self.base_url = root
        self.url = root + self.spec.prefix
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError(f"AgentGym env {env_name!r}: timeouts must be positive, got {timeout}, {connect_timeout}")
        if retries < 0:
            raise ValueError(f"AgentGym env {env_name!r}: retries must be >= 0, got {retries}")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.retries = int(retries)
        self.retry_backoff = float(retry_backoff)
        self.trust_env = trust_env
        if int(max_response_bytes) < 1 or int(max_json_depth) < 1:
            raise ValueError(f"AgentGym env {env_name!r}: max_response_bytes and max_json_depth must be >= 1, "
                             f"got {max_response_bytes}, {max_json_depth}")
        self.max_response_bytes = int(max_response_bytes)
        self.max_json_depth = int(max_json_depth)
        self.instruction: str = self.spec.instruction
        self.num_tasks: int | None = self.spec.num_tasks

        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._generation = 0  # bumped by close(): sessions of an earlier generation are closed
        self._lock = threading.Lock()  # guards the state below and _sessions; never held during a request
        self._env_id: Any = None
        self._stale = False  # after a server error the server-side env is presumed lost
        self._data_idx: int | None = None
        self._score = 0.0  # sum of this episode's step rewards (scaled)
        self._last_cumulative = 0.0  # last running score seen, for reward_cumulative servers
        self._baseline = 0.0  # the running score /reset reported

    def __repr__(self) -> str:
        return f"AgentGymEnv({self.env_name!r}, base_url={self.base_url!r}, protocol={self.spec.protocol!r})"

    # ------------------------------------------------------------------------------------------- Env API
    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """Start task ``task_id`` (data index ``data_range[0] + task_id``) and return its first observation.

        ``task_id=None`` picks ``seed % num_tasks`` (``seed`` when the range is unbounded; 0 without a seed).
        AgentGym servers are deterministic per
        data index, so the seed does not change a given task.
        """
        data_idx = self._data_index(task_id, seed)
        with self._lock:
            env_id, need_create = self._env_id, self._env_id is None or self._stale
        created = None
        try:
            if need_create:
                env_id = created = self._create()
            body = {self.spec.id_key: env_id, self.spec.reset_index_key: data_idx, **self.spec.reset_extra}
            answer = self._request("POST", "/reset", body)
            observation = self._observation(answer, self.spec.reset_observation, "reset", env_id)
        except EnvServerError:
            with self._lock:
                self._stale = True  # the next reset creates a fresh server-side env
                if created is not None:
                    self._env_id = created  # so close() can still release it
            raise
        baseline = 0.0
        if self.spec.reward_cumulative and isinstance(answer, Mapping):
            value = answer.get(self.spec.reward_key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                baseline = float(value) * self.spec.reward_scale
        with self._lock:
            self._env_id, self._stale, self._data_idx = env_id, False, data_idx
            self._score, self._last_cumulative, self._baseline = 0.0, baseline, baseline
        return observation

    def step(self, action: str) -> StepResult:
        """Send one action. Returns the server's observation, this step's reward and whether the episode ended.

        Raises :class:`EnvServerError` (only) when the server fails; see the module docstring.
        """
        with self._lock:
            env_id, stale = self._env_id, self._stale
        if env_id is None or stale:
            raise EnvServerError(
                "step() without a live episode: call reset() first" + (" (the last request failed)" if stale else ""),
                env_name=self.env_name, url=self.url,
            )
        if not isinstance(action, str):
            action = str(action)
        try:
            answer = self._request("POST", "/step", {self.spec.id_key: env_id, "action": action})
            if not isinstance(answer, Mapping):
                raise self._error(f"/step answered {_short(answer)}, not a JSON object", "/step")
            observation = self._observation(answer, self.spec.step_observation, "step", env_id)
            value = answer.get(self.spec.reward_key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise self._error(f"/step reward {self.spec.reward_key!r} = {_short(value)} is not a finite number",
                                  "/step")
        except EnvServerError:
            with self._lock:
                self._stale = True
            raise
        value = float(value) * self.spec.reward_scale
        done = any(self._flag(answer, k) for k in self.spec.done_key)
        with self._lock:
            if self.spec.reward_cumulative:
                reward, self._last_cumulative = value - self._last_cumulative, value
                self._score = value - self._baseline  # exact, not a float sum of differences
            else:
                reward = value
                self._score += reward
            score = self._score
            data_idx = self._data_idx
        consumed = {self.spec.reward_key, *self.spec.done_key, *self._observation_keys(self.spec.step_observation)}
        info: dict[str, Any] = {
            "score": score,
            "data_idx": data_idx,
            "server": self.base_url,
            "server_info": {k: v for k, v in answer.items() if k not in consumed},
        }
        if done and self.spec.success_threshold is not None:
            info["success"] = score >= self.spec.success_threshold - 1e-9
        return StepResult(observation=observation, reward=reward, done=done, info=info)

    def close(self) -> None:
        """Release the server-side env (POST /close where the server has one) and the HTTP sessions. Never raises."""
        with self._lock:
            env_id, self._env_id = self._env_id, None
            self._stale = False
        try:
            if env_id is not None and self._has_close():
                self._request("POST", "/close", {self.spec.id_key: env_id},
                              timeout=min(self.timeout, 5.0), retries=0)
        except Exception as exc:  # close must not raise: it also runs after the server already failed
            log.debug("closing %r failed: %s", self, exc)
        finally:
            with self._lock:
                sessions, self._sessions = self._sessions, []
                self._generation += 1  # threads open new sessions if this env is reset again
            for s in sessions:
                try:
                    s.close()
                except Exception:  # a session closing under an abandoned request; nothing left to release
                    pass

    def __enter__(self) -> "AgentGymEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------------------- extras
    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the server answers its health path with HTTP 200."""
        try:
            r = self._session().get(self.base_url + self.spec.health_path, timeout=(self.connect_timeout, timeout))
            return r.status_code == 200
        except requests.RequestException:
            return False

    def observe(self) -> str:
        """The current observation from ``GET /observation`` (raises :class:`EnvServerError` like ``step``)."""
        with self._lock:
            env_id = self._env_id
        if env_id is None:
            raise EnvServerError("observe() before reset()", env_name=self.env_name, url=self.url)
        return self._observation(None, "@observation", "observe", env_id)

    # ------------------------------------------------------------------------------------------ internals
    def _data_index(self, task_id: Any, seed: Any) -> int:
        start, end = self.spec.data_range
        n = None if end is None else end - start
        if task_id is None:
            t = 0 if seed is None else operator.index(seed) % n if n else abs(operator.index(seed))
        else:
            if isinstance(task_id, bool):
                raise TypeError(f"AgentGym env {self.env_name!r}: task_id must be an int, got {task_id!r}")
            t = operator.index(task_id)  # accepts numpy integers from parquet rows
            if t < 0 or (n is not None and t >= n):
                allowed = f"[0, {n}) (data indices {start}..{end - 1})" if n is not None else "[0, inf)"
                raise ValueError(
                    f"AgentGym env {self.env_name!r}: task_id {t} is outside {allowed}; "
                    f"lower train_tasks/val_tasks or pass data_range=[start, end] to the env."
                )
        return start + t

    def _flag(self, answer: Mapping[str, Any], key: str) -> bool:
        """``answer[key]`` as a strict boolean (missing: False); a value that is no flag raises."""
        value = answer.get(key, False)
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _FLAGS:
            return _FLAGS[value.strip().lower()]
        raise self._error(f"/step {key!r} = {_short(value)} is not a boolean", "/step")

    def _has_close(self) -> bool:
        """The spec's ``has_close``, or whether the server's OpenAPI schema lists ``POST {prefix}/close``."""
        if self.spec.has_close is not None:
            return self.spec.has_close
        with _CLOSE_SCHEMA_LOCK:
            known = _CLOSE_SCHEMA.get(self.url)
        if known is None:
            try:
                schema = self._request("GET", "/openapi.json", timeout=min(self.timeout, 5.0), retries=0, root=True)
                paths = schema.get("paths") if isinstance(schema, Mapping) else None
                entry = paths.get(self.spec.prefix + "/close") if isinstance(paths, Mapping) else None
                known = isinstance(entry, Mapping) and "post" in entry
            except EnvServerError as exc:  # no schema: assume no /close; asked again next time
                log.debug("%r: no OpenAPI schema (%s); not closing server-side envs", self, exc)
                return False
            with _CLOSE_SCHEMA_LOCK:
                _CLOSE_SCHEMA[self.url] = known
        return known

    def _create(self) -> Any:
        answer = self._request("POST", "/create", self.spec.create_body)
        try:
            env_id = self._walk(answer, self.spec.create_id_path)
        except (KeyError, IndexError, TypeError):
            raise self._error(
                f"/create answered {_short(answer)}; expected the env id at {self.spec.create_id_path or '(the answer)'!r}"
                f" for protocol {self.spec.protocol!r}", "/create") from None
        if isinstance(env_id, bool) or not isinstance(env_id, (int, str)):
            raise self._error(f"/create answered env id {_short(env_id)}, not an int or string", "/create")
        return env_id

    @staticmethod
    def _walk(value: Any, path: str) -> Any:
        for part in filter(None, path.split(".")):
            if isinstance(value, list) and part.lstrip("-").isdigit():
                value = value[int(part)]
            elif isinstance(value, Mapping):
                value = value[part]
            else:
                raise TypeError(f"cannot take {part!r} of {type(value).__name__}")
        return value

    @staticmethod
    def _observation_keys(how: str) -> set[str]:
        if how.startswith("@"):
            return set()
        if "{" in how:
            return {f.rstrip("?") for _, f, _, _ in string.Formatter().parse(how) if f}
        return {how.split(".")[0]} if how else set()

    def _observation(self, answer: Any, how: str, what: str, env_id: Any) -> str:
        """The observation in ``answer`` as the spec's ``how`` locates it (path, template or ``@observation``)."""
        if how == "@observation":
            answer = self._request("GET", "/observation", params={self.spec.id_key: env_id})
            return _as_text(answer)
        if "{" in how:
            if not isinstance(answer, Mapping):
                raise self._error(f"/{what} answered {_short(answer)}, not a JSON object", f"/{what}")
            fields = _Fields({k: ", ".join(map(_as_text, v)) if isinstance(v, list) else _as_text(v)
                              for k, v in answer.items()})
            try:
                return how.format_map(fields)
            except KeyError as exc:
                raise self._error(f"/{what} answer has no {exc.args[0]!r}: {_short(answer)}", f"/{what}") from None
            except (ValueError, IndexError) as exc:
                raise self._error(f"bad observation template {how!r} in the spec: {exc}", f"/{what}") from None
        try:
            return _as_text(self._walk(answer, how))
        except (KeyError, IndexError, TypeError):
            raise self._error(f"/{what} answer has no observation at {how!r}: {_short(answer)}", f"/{what}") from None

    def _session(self) -> requests.Session:
        """This thread's Session for this env (requests Sessions must not be shared between threads)."""
        generation, session = getattr(self._local, "session", (None, None))
        if session is None or generation != self._generation:
            session = requests.Session()
            session.trust_env = self.trust_env
            with self._lock:
                self._sessions.append(session)
                self._local.session = (self._generation, session)
        return session

    def _error(self, message: str, path: str, cause: BaseException | str | None = None) -> EnvServerError:
        return EnvServerError(message, env_name=self.env_name, url=self.url + path, cause=cause)

    def _request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                 timeout: float | None = None, retries: int | None = None, root: bool = False) -> Any:
        """One JSON request with retries; returns the decoded answer or raises :class:`EnvServerError`.

        ``root``: ``path`` is taken from the server root, not below the env's prefix.
        """
        url = (self.base_url if root else self.url) + path
        attempts = 1 + (self.retries if retries is None else retries)
        read_timeout = self.timeout if timeout is None else timeout
        for attempt in range(attempts):
            last = attempt == attempts - 1
            session = self._session()
            deadline = time.monotonic() + read_timeout
            try:
                response = session.request(method, url, json=body, params=params, stream=True,
                                            timeout=(self.connect_timeout, read_timeout))
                with response:
                    content = self._read_body(response, deadline, method, path, read_timeout)
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
                if _never_sent(exc) and not last:
                    time.sleep(self.retry_backoff * 2**attempt)
                    continue
                if isinstance(exc, requests.exceptions.ConnectTimeout):
                    why = f"could not connect within {self.connect_timeout:g}s"
                elif isinstance(exc, (requests.exceptions.Timeout, urllib3.exceptions.ReadTimeoutError)):
                    why = f"no answer within {read_timeout:g}s (timeout)"
                elif _never_sent(exc):
                    why = "connection refused (is the server running?)"
                else:
                    why = "connection failed"
                tries = f" after {attempt + 1} attempts" if attempt else ""
                raise self._error(f"{method} {path}: {why}{tries}", path, exc) from exc
            if response.status_code == 503 and not last:
                time.sleep(self.retry_backoff * 2**attempt)
                continue
            text = content.decode(response.encoding or "utf-8", errors="replace")
            if not 200 <= response.status_code < 300:
                raise self._error(f"{method} {path}: HTTP {response.status_code}: {_short(text)}", path)
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise self._error(f"{method} {path}: answer is not JSON: {_short(text)}", path, exc) from None
            except RecursionError:
                data = None  # deeper than the decoder's stack: over any depth limit
            if data is None and text.strip() != "null" or _depth(data) > self.max_json_depth:
                raise self._error(f"{method} {path}: answer is nested deeper than max_json_depth="
                                  f"{self.max_json_depth}: {_short(text)}", path)
            if isinstance(data, Mapping) and data.get("error") is not None:
                raise self._error(f"{method} {path}: server error: {_short(data['error'])}", path)
            return data
        raise AssertionError("unreachable")  # the last attempt always returns or raises

    def _read_body(self, response: requests.Response, deadline: float, method: str, path: str,
                   read_timeout: float) -> bytes:
        """The whole body, read in pieces as they arrive, within ``deadline`` and ``max_response_bytes``."""
        size = response.headers.get("Content-Length", "")
        if size.isdigit() and int(size) > self.max_response_bytes:
            raise self._error(f"{method} {path}: answer of {int(size)} bytes is over max_response_bytes="
                              f"{self.max_response_bytes}", path)
        parts, total = [], 0
        raw = response.raw
        while True:
            if time.monotonic() > deadline:
                raise self._error(f"{method} {path}: no complete answer within {read_timeout:g}s (timeout; "
                                  f"{total} bytes arrived)", path)
            piece = raw.read1(_CHUNK, decode_content=True)  # what has arrived, at most one wait of read_timeout
            if not piece:
                return b"".join(parts)
            total += len(piece)
            if total > self.max_response_bytes:
                raise self._error(f"{method} {path}: answer is over max_response_bytes={self.max_response_bytes}",
                                  path)
            parts.append(piece)
