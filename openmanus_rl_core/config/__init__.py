"""The typed configuration: the schema (every default), loading it with Hydra, the cross-field rules, the checks of
plugin-owned kwargs, and what a resumed run may change."""

from openmanus_rl_core.config.fields import ConfigError

__all__ = ["ConfigError"]
