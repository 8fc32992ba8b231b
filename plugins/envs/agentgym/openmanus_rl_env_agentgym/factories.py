"""The ``openmanus_rl.envs`` entry points: one factory per AgentGym env name, all bound to the same client.

``registry("env").build("textcraft", base_port=36001, num_servers=4)`` calls ``textcraft(**kwargs)``, which
builds an :class:`~openmanus_rl_env_agentgym.client.AgentGymEnv` for the next server, round-robin.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Mapping

from .client import AgentGymEnv
from .spec import get_spec

__all__ = ["AgentGymFactory", "make_env"]

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


class AgentGymFactory:
    """``factory(**kwargs) -> AgentGymEnv`` for one AgentGym env name (see :func:`make_env`)."""

    def __init__(self, env_name: str):
        self.env_name = env_name
        self.__doc__ = f"Build an AgentGym {env_name!r} env: make_env({env_name!r}, **kwargs)."

    def __call__(self, **kwargs: Any) -> AgentGymEnv:
        return make_env(self.env_name, **kwargs)

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
