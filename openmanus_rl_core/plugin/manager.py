"""The pluggy plugin manager for the ``openmanus_rl`` entry-point group (lifecycle hooks, config dirs)."""

from __future__ import annotations

import logging
import warnings

import importlib_metadata
import pluggy

from openmanus_rl_core import hookspecs
from openmanus_rl_core.plugin.registry import PluginEntry, load_entry

log = logging.getLogger(__name__)

HOOK_GROUP = hookspecs.PROJECT


def hook_entries() -> list[PluginEntry]:
    """Hook plugin modules registered in the ``openmanus_rl`` group, from metadata alone."""
    out = []
    for ep in importlib_metadata.entry_points(group=HOOK_GROUP):
        dist = getattr(ep, "dist", None)
        out.append(PluginEntry("hooks", ep.name, ep.value, dist.metadata["Name"] if dist else "unknown",
                               dist.version if dist else "?"))
    return sorted(set(out), key=lambda e: (e.name, e.dist))


def make_plugin_manager(load_entry_points: bool = True) -> pluggy.PluginManager:
    """A new manager with the hookspecs and, unless told not to, every installed hook plugin.

    A hook plugin that fails to import is skipped with a warning naming it; the others still load.
    """
    pm = pluggy.PluginManager(HOOK_GROUP)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        for entry in hook_entries():
            try:
                module = load_entry(entry)
                pm.register(module, name=entry.qualified_name)
            except Exception as exc:  # one broken plugin must not take the run down
                warnings.warn(f"hook plugin skipped: {exc}", RuntimeWarning, stacklevel=2)
    return pm

