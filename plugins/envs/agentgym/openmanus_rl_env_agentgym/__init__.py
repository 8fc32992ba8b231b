"""openmanus-rl env plugin for AgentGym: an HTTP client for every AgentGym env server, and a server launcher.

- :class:`AgentGymEnv` (``client.py``): the Env over HTTP; raises :class:`EnvServerError` when the server fails.
- :class:`ServerLauncher` (``launcher.py``): starts N servers on consecutive ports, health-checks, restarts, stops.
- ``envs.yaml``: the per-env spec table (request shape, keys, ports, start commands); read by both.
- ``factories.py``: the ``openmanus_rl.envs`` entry points, one per AgentGym env name.
"""

from typing import Any

from .client import AgentGymEnv, EnvServerError
from .spec import EnvSpec, env_names, get_spec


def __getattr__(name: str) -> Any:
    # The launcher is imported on first use, so `python -m openmanus_rl_env_agentgym.launcher` runs it fresh.
    if name in ("LauncherError", "ServerLauncher", "shared_launcher"):
        from . import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AgentGymEnv",
    "EnvServerError",
    "EnvSpec",
    "LauncherError",
    "ServerLauncher",
    "env_names",
    "get_spec",
    "shared_launcher",
]
