"""Hydra configuration: the core's config tree plus every folder plugins contribute.

The core ships ``configs/`` (``config.yaml`` and the ``algorithm``, ``model``, ``rollout``, ``trainer``,
``data`` groups); plugins add group options (``env/<name>.yaml``, ``reward/<name>.yaml`` ...) through the
``openmanus_rl_config_dirs`` hook, so a freshly installed plugin is selectable with ``env=<name>``.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from openmanus_rl_core.plugins import make_plugin_manager


def select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg.a.b`` for ``"a.b"``, or ``default`` when a key is missing or null.

    Works on a DictConfig, plain dicts and attribute objects; a missing key in a struct-mode DictConfig or an
    unresolvable interpolation reads as missing.
    """
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:
            return default
    return default if node is None else node


def core_config_dir() -> Path:
    """Folder of the core's own config tree (the repo's top-level ``configs/``, installed as a package)."""
    return Path(str(importlib.resources.files("openmanus_rl_core.configs")))


def plugin_config_dirs(pm=None) -> list[str]:
    """Search-path URLs contributed by installed plugins, in registration order, without duplicates."""
    pm = pm or make_plugin_manager()
    urls: list[str] = []
    for contributed in reversed(pm.hook.openmanus_rl_config_dirs()):  # pluggy calls last-registered first
        for d in contributed or []:
            url = d if "://" in str(d) else f"file://{Path(d).resolve()}"
            if url not in urls:
                urls.append(url)
    return urls


def compose(overrides: Sequence[str] = (), config_name: str = "config", pm=None) -> DictConfig:
    """Compose the config as ``openmanus-rl <command> key=value ...`` sees it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    searchpath = plugin_config_dirs(pm)
    extra = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(core_config_dir()), version_base="1.3", job_name="openmanus_rl"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides) + extra)
    return cfg


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=False)
