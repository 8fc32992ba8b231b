"""``openenv``: an OpenEnv environment server (openenv-core) as an openmanus-rl env.

Where the env comes from (``env.kwargs``, exactly one of):

- ``url``: servers the user runs (one URL, or a list of them);
- ``package``: an installed OpenEnv env distribution; its ``openenv.yaml`` names its app, which the driver serves
  itself (:mod:`openmanus_rl_env_openenv.servers`) on free loopback ports;
- ``app``: the same for an app given as ``module:attr`` (an env package without a manifest).

:meth:`OpenEnvEnv.serve` (the driver, once per command) checks the servers or starts them, and finds how many
WebSocket sessions a server holds at once by opening them until the server says ``CAPACITY_REACHED`` (at most
``sessions``). ``sessions`` left unset is the number of episodes the command plays at once (``at_once``, from the
command: ``train``'s batch x ``rollout.n`` or its validation, ``rollout``'s tasks x ``rollout.n``). A started env
whose server holds fewer than ``sessions`` gets more servers (at most ``max_servers``). Every env, in every process,
is then built with the servers' URLs and the ``sessions`` they were sized for.

One episode is one WebSocket session (one env instance on the server), opened by :meth:`OpenEnvEnv.reset` on the
next server with a free session and closed by :meth:`OpenEnvEnv.close`:

- ``reset(task_id, seed)`` sends ``reset(seed=task_id)`` (``seed`` when there is no task id): a task id names the
  env's seeded episode. Its observation is the first observation.
- an observation reads as its fields, one ``name: value`` line each, or as the one field ``obs_field``;
- ``instruction`` (the system prompt's task text) is ``env.kwargs.instruction`` or the env's ``/metadata``
  description, followed by the action's fields, types and descriptions from ``/schema``;
- ``step(action)`` turns the reply into the env's Action: a JSON object of its fields, or, for an action with one
  required field, the text as that field's value (coerced to its type). An action the server's Action model refuses
  is an invalid action (``info["invalid"]``) whose observation is the validation message; the episode goes on.
- the step's reward is the server's (its rubric's), ``done`` the server's. ``info["openenv_reward"]`` keeps the raw
  reward (None when the server gave none); with ``success_reward`` set, a finished episode whose rewards sum to at
  least that is a success.

A server that dies mid-episode fails that episode's call (the episode ends as ``env_error``); the driver's watchdog
restarts the server on its port, and later episodes play on it again.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from openmanus_rl_core.plugin.envs import EnvService, EnvUnavailableError
from openmanus_rl_core.protocols import StepResult, as_text

from openmanus_rl_env_openenv import schema as sc
from openmanus_rl_env_openenv.wire import CAPACITY, VALIDATION, ServerError, get_json, run
from openmanus_rl_env_openenv.manifest import check_app, find_manifest

__all__ = ["OpenEnvEnv", "Settings", "probe_sessions"]

SESSION_WAIT_S = 5.0
"""How long :meth:`OpenEnvEnv.reset` keeps looking for a free session (a just-closed one is released by the server a
moment after its client left) before the episode fails."""


@dataclass
class Settings:
    """``env.kwargs`` of ``env=openenv`` (the module docstring; configs/env/openenv.yaml explains each)."""

    url: Union[str, List[str], None] = None
    package: Optional[str] = None
    app: Optional[str] = None
    obs_field: Optional[str] = None
    instruction: Optional[str] = None
    sessions: Optional[int] = None
    max_servers: int = 8
    server_env: Dict[str, Any] = field(default_factory=dict)
    log_dir: Optional[str] = None
    timeout_s: float = 60.0
    health_timeout_s: float = 120.0
    success_reward: Optional[float] = None

    @property
    def urls(self) -> list[str]:
        urls = [self.url] if isinstance(self.url, str) else list(self.url or [])
        return [u.rstrip("/") for u in urls]

    def check_values(self) -> None:
        given = [k for k in ("url", "package", "app") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"{'/'.join(given) or 'url'}: give exactly one of url (a running server), package (an "
                             "installed OpenEnv env) or app (module:attr), got "
                             + (", ".join(f"{k}={getattr(self, k)}" for k in given) or "none"))
        for name in ("sessions", "max_servers"):
            value = getattr(self, name)
            if value is None and name == "sessions":  # the command's episodes at once (serve's at_once)
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value}: must be an integer >= 1")
        for name in ("timeout_s", "health_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value}: must be a number > 0")
        for u in self.urls:
            if not isinstance(u, str) or not u.startswith(("http://", "https://")):
                raise ValueError(f"url={u}: must be an http:// or https:// URL")


def _check_source(s: Settings) -> None:
    """The env's source exists: its servers answer, or its package is an OpenEnv env (its app is installed)."""
    if s.package:
        find_manifest(s.package)
    elif s.app:
        check_app(s.app)
    else:
        from openmanus_rl_env_openenv.servers import healthy

        down = [u for u in s.urls if not healthy(u, timeout=min(5.0, s.timeout_s))]
        if down:
            raise ValueError(f"url={', '.join(down)}: no OpenEnv server answers GET /health there (start it, e.g. "
                             "`uvicorn my_env.server.app:app --port 8000`, or let the plugin serve an installed env "
                             "with env.kwargs.package=<distribution>)")


def probe_sessions(url: str, wanted: int, timeout: float) -> int:
    """How many WebSocket sessions the server at ``url`` holds at once, counted up to ``wanted``: sessions are
    opened one by one (each asks for the state) until the server answers ``CAPACITY_REACHED``, then all closed.
    A server that cannot make an env for a session raises :class:`EnvUnavailableError` with its message."""
    from openmanus_rl_env_openenv.client import Session

    async def probe() -> int:
        opened: list[Any] = []
        try:
            while len(opened) < wanted:
                session = Session(url, connect_timeout_s=timeout, message_timeout_s=timeout)
                try:
                    await session._send_and_receive({"type": "state"})
                except ServerError as exc:
                    if exc.code in (CAPACITY, "FACTORY_ERROR", "SESSION_ERROR"):
                        await session.disconnect()
                        if exc.code == CAPACITY:
                            break
                        raise EnvUnavailableError(f"OpenEnv env at {url}: the server cannot start a session: "
                                                  f"{exc}") from None
                    # any other error (a state that needs a reset first) still held a session
                opened.append(session)
            return len(opened)
        finally:
            for session in opened:
                await session.disconnect()

    return run(probe(), timeout * (wanted + 1))


# The servers' /schema and /metadata, fetched once per process and URL list.
_META: dict[tuple[str, ...], dict[str, Any]] = {}
_META_LOCK = threading.Lock()
_NEXT = itertools.count(os.getpid() % 9973)  # spreads each process's first sessions over the servers


def server_info(urls: list[str], timeout: float) -> dict[str, Any]:
    key = tuple(urls)
    with _META_LOCK:
        if key not in _META:
            for i, url in enumerate(urls):  # the first that answers (another may be restarting)
                try:
                    schemas = get_json(url + "/schema", timeout)
                    break
                except Exception:  # noqa: BLE001
                    if i == len(urls) - 1:
                        raise
            try:
                metadata = get_json(url + "/metadata", timeout)
            except Exception:  # noqa: BLE001  (optional: only the prompt's first line)
                metadata = {}
            action = schemas.get("action") or {}
            _META[key] = {"action": action, "fields": sc.action_fields(action),
                          "observation": sc.observation_fields(schemas.get("observation") or {}),
                          "metadata": metadata if isinstance(metadata, dict) else {}}
        return _META[key]


class OpenEnvEnv:
    """An OpenEnv env's episodes over WebSocket sessions (module docstring)."""

    @dataclass
    class Kwargs(Settings):
        """``env.kwargs``, checked before the run starts: the values, and that the source is there (the servers
        answer ``/health``; the package is an installed OpenEnv env)."""

        def __post_init__(self) -> None:
            self.check_values()
            _check_source(self)

    def __init__(self, **kwargs: Any):
        self.s = Settings(**kwargs)
        self.s.check_values()
        if not self.s.urls:
            raise ValueError("the openenv env reaches its servers by URL: the driver's serve() starts the servers of "
                             "env.kwargs.package / env.kwargs.app and hands every env their URLs")
        self._session: Any = None
        self._done = True
        self._total = 0.0

    # ---------------------------------------------------------------------------------------------- the server
    @property
    def _info(self) -> dict[str, Any]:
        return server_info(self.s.urls, self.s.timeout_s)

    @property
    def instruction(self) -> str:
        info = self._info
        head = self.s.instruction
        if head is None:
            name, about = (str(info["metadata"].get(k) or "") for k in ("name", "description"))
            about = "" if about in ("", f"{name} environment") else f": {about}"  # openenv's default says nothing
            head = f"OpenEnv environment {name}{about}." if name else "An OpenEnv environment."
        title = str(info["action"].get("title") or "Action")
        return f"{head}\n{sc.describe_action(title, info['fields'])}"

    def _run(self, coro: Any) -> Any:
        return run(coro, self.s.timeout_s + 5.0)

    def _open(self, seed: int | None) -> tuple[Any, Any]:
        """A session on the next server with room for it, reset. A full server (or one that does not answer: being
        restarted) is passed over for the next; after a round of them, the round is tried again for up to
        SESSION_WAIT_S seconds."""
        from openmanus_rl_env_openenv.client import Session

        urls = self.s.urls
        data = {} if seed is None else {"seed": int(seed)}
        deadline = time.monotonic() + SESSION_WAIT_S
        while True:
            full, last = 0, None
            for _ in range(len(urls)):
                session = Session(urls[next(_NEXT) % len(urls)], connect_timeout_s=self.s.timeout_s,
                                  message_timeout_s=self.s.timeout_s)
                try:
                    return session, self._run(session.reset(**data))
                except ServerError as exc:
                    self._run(session.disconnect())
                    if exc.code != CAPACITY:
                        raise
                    full += 1
                except (ConnectionError, OSError) as exc:
                    self._run(session.disconnect())
                    last = exc
            if time.monotonic() >= deadline:
                if last is not None:
                    raise last
                raise RuntimeError(f"every session of the env's {len(urls)} server(s) is in use: more episodes play "
                                   f"at once than env.kwargs.sessions={self.s.sessions} made room for; raise it to "
                                   "data.train_batch_size x rollout.n (and the validation tasks)")
            time.sleep(0.05)

    # ---------------------------------------------------------------------------------------------- protocol
    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """A new session on a free server, reset with ``seed=task_id`` (``seed`` without a task id)."""
        self.close()
        value = task_id if task_id is not None else seed
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"openenv env: task_id/seed must be an int, got {type(value).__name__} {value!r}")
        self._session, result = self._open(value)
        self._done, self._total = bool(result.done), 0.0
        return self._text(result.observation)

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, dict):
            return as_text(observation)
        return sc.observation_text(observation, self.s.obs_field)

    def step(self, action: str) -> StepResult:
        """One action; a reply that gives no valid action is an invalid action, answered, never raised."""
        if self._session is None:
            raise RuntimeError("openenv env: call reset() before step()")
        if self._done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True})
        info = self._info
        payload, why = sc.to_action(as_text(action), info["action"], info["fields"])
        if payload is None:
            return StepResult(why, 0.0, False, {"invalid": True})
        try:
            result = self._run(self._session.step(payload))
        except ServerError as exc:
            if exc.code != VALIDATION:
                raise
            return StepResult(sc.validation_message(exc.data.get("errors"), str(exc.data.get("message") or "")),
                              0.0, False, {"invalid": True})
        raw = result.reward
        reward = float(raw) if isinstance(raw, (int, float)) and math.isfinite(float(raw)) else 0.0
        self._total += reward
        self._done = bool(result.done)
        out: dict[str, Any] = {"openenv_reward": raw}
        if self._done and self.s.success_reward is not None:
            out["success"] = self._total >= float(self.s.success_reward)
        return StepResult(self._text(result.observation), reward, self._done, out)

    def close(self) -> None:
        session, self._session = self._session, None
        self._done = True
        if session is not None:
            try:
                self._run(session.disconnect())
            except Exception:  # noqa: BLE001  (a dead server's session is gone anyway)
                pass

    # ----------------------------------------------------------------------------------------- the driver's side
    @classmethod
    def serve(cls, at_once: int | None = None, **kwargs: Any) -> EnvService:
        """Check the user's servers, or start the package's (or app's) servers, for ``sessions`` episodes at once
        (unset: ``at_once``, the command's): see the module docstring."""
        s = Settings(**kwargs)
        s.check_values()
        why = "env.kwargs.sessions"
        if s.sessions is None:
            if at_once is None:
                raise ValueError("env.kwargs.sessions is not set and the command did not say how many episodes it "
                                 "plays at once: set env.kwargs.sessions=<episodes at once>")
            s.sessions, why = int(at_once), "the episodes this command plays at once; env.kwargs.sessions sets it"
        kwargs = {**kwargs, "sessions": s.sessions}  # every env knows what its servers were sized for
        if s.urls:
            return _serve_urls(s, kwargs, why)
        from openmanus_rl_env_openenv.servers import ServerPool, ServerStartError

        app = find_manifest(s.package).app if s.package else s.app
        pool = ServerPool(app, health_timeout_s=s.health_timeout_s, env=s.server_env, log_dir=s.log_dir)
        what = f"OpenEnv env {s.package or app}"
        try:
            first = pool.add(1)[0]
            _check_obs_field(s, [first])
            held = probe_sessions(first, s.sessions, s.timeout_s)
            if held < 1:
                raise EnvUnavailableError(f"{what}: its new server at {first} refused every session")
            needed = -(-s.sessions // held)
            if needed > s.max_servers:
                raise EnvUnavailableError(
                    f"{what}: a server holds {held} session(s) at once, so {_sessions(s, why)} needs "
                    f"{needed} servers, more than env.kwargs.max_servers={s.max_servers}: raise max_servers or lower "
                    "sessions")
            if needed > 1:
                pool.add(needed - 1)
        except ServerStartError as exc:
            pool.stop()
            raise EnvUnavailableError(f"{what}: {exc}") from None
        except BaseException:
            pool.stop()
            raise
        pool.start_watchdog()

        def check() -> None:  # the env-error watch: the servers answer again (restarted), or the run stops
            try:
                pool.ensure_alive()
            except ServerStartError as exc:
                raise EnvUnavailableError(f"{what}: {exc}") from None

        served = {**kwargs, "url": pool.urls, "package": None, "app": None}
        service = EnvService(served, stop=pool.stop, check=check)
        service.pool = pool  # type: ignore[attr-defined]  (tests and the benchmark read its servers)
        return service


def _check_obs_field(s: Settings, urls: list[str]) -> None:
    if s.obs_field is None:
        return
    names = server_info(urls, s.timeout_s)["observation"]
    if s.obs_field not in names:
        raise EnvUnavailableError(f"env.kwargs.obs_field={s.obs_field}: the env's observation has no such field "
                                  f"(its fields: {', '.join(names) or 'none'})")


def _sessions(s: Settings, why: str) -> str:
    """How a message names the sessions asked for: the setting, or the command's count."""
    return f"env.kwargs.sessions={s.sessions}" if why == "env.kwargs.sessions" else f"sessions={s.sessions} ({why})"


def _serve_urls(s: Settings, kwargs: dict[str, Any], why: str) -> EnvService:
    from openmanus_rl_env_openenv.servers import healthy

    def answering() -> None:
        down = [u for u in s.urls if not healthy(u, timeout=min(5.0, s.timeout_s))]
        if down:
            raise EnvUnavailableError(f"OpenEnv env: no server answers GET /health at {', '.join(down)}")

    answering()
    _check_obs_field(s, s.urls)
    held = 0
    for u in s.urls:
        held += probe_sessions(u, s.sessions - held, s.timeout_s)
        if held >= s.sessions:
            break
    if held < s.sessions:
        raise EnvUnavailableError(
            f"OpenEnv env at {', '.join(s.urls)}: the server(s) hold {held} session(s) at once, fewer than "
            f"{_sessions(s, why)}: start more servers (env.kwargs.url takes a list), or play fewer episodes at "
            "once")
    return EnvService(dict(kwargs), check=answering)

