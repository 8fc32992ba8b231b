"""The plugin machinery: the registries over the entry-point groups, the plugin manager of the hooks, and the
services an env may need running. The contract a plugin implements is :mod:`openmanus_rl_core.protocols` (and
:mod:`openmanus_rl_core.hookspecs` for hooks)."""
