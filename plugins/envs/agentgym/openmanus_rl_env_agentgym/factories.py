"""The ``openmanus_rl.envs`` entry points: one factory per AgentGym env name, all bound to the same client.

``registry("env").build("agentgym_textcraft", base_port=36001, num_servers=4)`` calls ``textcraft(**kwargs)``,
which builds an :class:`~openmanus_rl_env_agentgym.client.AgentGymEnv` for the next server, round-robin.

``factory.serve(**kwargs)`` is what the core's driver calls once per command (``openmanus_rl_core.plugin.envs``): it
health-checks the servers, or with ``autostart=True`` starts them under one :class:`ServerLauncher` owned by the
driver (its watchdog is the only thing that restarts them), and returns the kwargs every env is built with
(``autostart`` off: workers reach the servers by URL).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Mapping

from openmanus_rl_core.plugin.envs import EnvService, EnvUnavailableError

from .client import AgentGymEnv
from .spec import get_spec

__all__ = ["AgentGymFactory", "make_env", "serve_env"]

_COUNTERS: dict[tuple, itertools.count] = {}
_COUNTERS_LOCK = threading.Lock()


def _next_index(key: tuple) -> int:
    with _COUNTERS_LOCK:
        counter = _COUNTERS.setdefault(key, itertools.count())
        return next(counter)


def make_env(
    env_name: str,
    *,
    base_url: str | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    base_port: int | None = None,
    num_servers: int = 1,
    autostart: bool = False,
    launcher: Mapping[str, Any] | None = None,
    **client_kwargs: Any,
) -> AgentGymEnv:
    """Build an AgentGymEnv for ``env_name``.

    With ``base_url`` or ``port``: that server. Otherwise one of ``num_servers`` servers on ports
    ``base_port .. base_port + num_servers - 1`` (default base: the spec's ``default_port``), chosen round-robin
    per process. With ``autostart=True`` those servers are started (once per process, reusing healthy ones)
    by a shared :class:`~openmanus_rl_env_agentgym.launcher.ServerLauncher` with a watchdog; ``launcher``
    holds its options (``command``, ``health_timeout``, ``log_dir``, ``env``, ...; the Hydra env configs pass
    their ``launcher:`` block here). Other keyword arguments go to :class:`AgentGymEnv`.
    """
    if base_url is not None or port is not None:
        return AgentGymEnv(env_name, base_url=base_url, port=port, host=host, **client_kwargs)
    if int(num_servers) < 1:
        raise ValueError(f"AgentGym env {env_name!r}: num_servers must be >= 1, got {num_servers}")
    first = int(base_port) if base_port is not None else get_spec(env_name).default_port
    if autostart:
        from .launcher import shared_launcher  # only runs servers when asked to

        options = {k: v for k, v in dict(launcher or {}).items()
                   if k not in ("num_servers", "base_port", "host") and v is not None}
        servers = shared_launcher(env_name, host=host, base_port=first, num_servers=int(num_servers), **options)
        return AgentGymEnv(env_name, base_url=servers.next_base_url(), **client_kwargs)
    i = _next_index((env_name, host, first, int(num_servers)))
    return AgentGymEnv(env_name, port=first + i % int(num_servers), host=host, **client_kwargs)


def serve_env(env_name: str, *, base_url: str | None = None, port: int | None = None, host: str = "127.0.0.1",
              base_port: int | None = None, num_servers: int = 1, autostart: bool = False,
              launcher: Mapping[str, Any] | None = None, **client_kwargs: Any) -> EnvService:
    """Check (or with ``autostart`` start) the servers :func:`make_env` would use with the same kwargs.

    Raises :class:`EnvUnavailableError` naming each server that does not answer and how to start one.
    """
    from .launcher import LauncherError, ServerLauncher

    kwargs = dict(base_url=base_url, port=port, host=host, base_port=base_port, num_servers=num_servers,
                  launcher=launcher, **client_kwargs)
    if autostart and base_url is None and port is None:
        options = {k: v for k, v in dict(launcher or {}).items()
                   if k not in ("num_servers", "base_port", "host") and v is not None}
        first = int(base_port) if base_port is not None else get_spec(env_name).default_port
        servers = ServerLauncher.for_env(env_name, host=host, base_port=first, num_servers=int(num_servers),
                                         reuse_existing=True, **options)
        try:
            servers.start()
        except LauncherError as exc:
            raise EnvUnavailableError(f"AgentGym env {env_name!r}: autostart failed: {exc}") from None
        servers.start_watchdog()

        def restarted() -> None:  # waits for a restart in progress; restarts a dead server itself otherwise
            try:
                for p in servers.ports:
                    servers.ensure_alive(p)
            except LauncherError as exc:
                raise EnvUnavailableError(f"AgentGym env {env_name!r}: {exc}") from None

        return EnvService(kwargs, stop=servers.stop, check=restarted)
    if base_url is not None or port is not None:
        urls = [AgentGymEnv(env_name, base_url=base_url, port=port, host=host).base_url]
    else:
        first = int(base_port) if base_port is not None else get_spec(env_name).default_port
        urls = [f"http://{host}:{first + i}" for i in range(int(num_servers))]
    def answering() -> None:
        down = [u for u in urls if not AgentGymEnv(env_name, base_url=u).healthy()]
        if down:
            command = (launcher or {}).get("command") or get_spec(env_name).command
            raise EnvUnavailableError(
                f"AgentGym env {env_name!r}: no server answers at {', '.join(down)}; start one per port "
                f"(`{command}` with --port; docs/agentgym.md has each env's commands) or set "
                f"env.kwargs.autostart=true")

    answering()
    return EnvService(kwargs, check=answering)


class AgentGymFactory:
    """``factory(**kwargs) -> AgentGymEnv`` for one AgentGym env name (see :func:`make_env`);
    ``factory.serve(**kwargs)`` checks or starts its servers (see :func:`serve_env`)."""

    def __init__(self, env_name: str):
        self.env_name = env_name
        self.__doc__ = f"Build an AgentGym {env_name!r} env: make_env({env_name!r}, **kwargs)."

    def __call__(self, **kwargs: Any) -> AgentGymEnv:
        return make_env(self.env_name, **kwargs)

    def serve(self, **kwargs: Any) -> EnvService:
        return serve_env(self.env_name, **kwargs)

    def __repr__(self) -> str:
        return f"AgentGymFactory({self.env_name!r})"


academia = AgentGymFactory("academia")
alfworld = AgentGymFactory("alfworld")
babyai = AgentGymFactory("babyai")
maze = AgentGymFactory("maze")
wordle = AgentGymFactory("wordle")
movie = AgentGymFactory("movie")
sciworld = AgentGymFactory("sciworld")
sheet = AgentGymFactory("sheet")
sqlgym = AgentGymFactory("sqlgym")
textcraft = AgentGymFactory("textcraft")
todo = AgentGymFactory("todo")
weather = AgentGymFactory("weather")
webarena = AgentGymFactory("webarena")
webshop = AgentGymFactory("webshop")
