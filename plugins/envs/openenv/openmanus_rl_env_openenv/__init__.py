"""The ``openenv`` env for openmanus-rl: OpenEnv environment servers (openenv-core) reached by URL, or served by the
plugin from an installed OpenEnv env package (see :mod:`openmanus_rl_env_openenv.env`)."""

from openmanus_rl_env_openenv.env import OpenEnvEnv

__all__ = ["OpenEnvEnv"]
