"""Which Reasoning Gym dataset an env serves: its settings checked before a run starts (one line naming the key and
the value), the dataset built once per process, its items generated on demand.

A dataset is one name (``leg_counting``) or a weighted mix (``{leg_counting: 1, spell_backward: 3}``: Reasoning
Gym's ``composite`` dataset, each item drawn from one of them by weight). ``config`` holds the dataset's own
settings, the fields of its config dataclass (``reasoning_gym.factory.DATASETS[name][1]``); for a mix, one mapping
per name. ``size`` and ``seed`` are the env's own keys, never set inside ``config``.

``reasoning_gym`` is imported on first use (about 1 s of CPU): listing plugins never pays for it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["Spec", "make_spec", "dataset_names", "build", "item", "has_answers", "HASH_DEPENDENT"]

# Datasets of reasoning-gym 0.1.25 whose items depend on Python's string hashing (they iterate over sets of
# strings): two processes with different hash seeds give different items for one task id. Measured by generating
# items 0-3 of every dataset under PYTHONHASHSEED=1 and =2 (tests/test_reasoning_gym_env.py checks two of them).
HASH_DEPENDENT = frozenset({"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note",
                            "word_ladder"})
OWN_KEYS = ("size", "seed")  # the env's keys, set for every dataset of a mix


@dataclass(frozen=True)
class Spec:
    """A dataset, hashable: ``names`` in order (one for a single dataset), ``weights`` (None for a single
    dataset), ``config`` (the settings as sorted JSON: per name for a mix), ``size``, ``seed``."""

    names: tuple[str, ...]
    weights: tuple[float, ...] | None
    config: str
    size: int
    seed: int

    @property
    def label(self) -> str:
        """``leg_counting``, or ``composite(leg_counting:1,spell_backward:3)``."""
        if self.weights is None:
            return self.names[0]
        return "composite(" + ",".join(f"{n}:{w:g}" for n, w in zip(self.names, self.weights)) + ")"

    def settings(self) -> dict[str, Any]:
        return json.loads(self.config)


def _registry() -> dict[str, tuple[type, type]]:
    # The package registers its datasets while it imports, into reasoning_gym.factory.DATASETS, which exists (empty)
    # early on. Importing the package first waits for another thread's import of it to finish (the episodes of a
    # rollout start on several threads); importing only the factory could return the registry half filled.
    import reasoning_gym  # noqa: F401
    from reasoning_gym.factory import DATASETS

    return DATASETS


def dataset_names() -> list[str]:
    """Every dataset name the installed reasoning-gym has (``composite`` excluded: a mapping makes one)."""
    return sorted(n for n in _registry() if n != "composite")


def plain(value: Any) -> Any:
    """OmegaConf containers (and any mapping or list) as plain dicts and lists."""
    if hasattr(value, "_get_node"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _show(value: Any) -> str:
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


def _unknown_dataset(name: Any, key: str) -> ValueError:
    names = dataset_names()
    if name == "composite":
        return ValueError(f"{key}=composite: give the mix itself, as a mapping of dataset names to weights, e.g. "
                          "env.kwargs.dataset={leg_counting:1,spell_backward:3}")
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else \
        f"reasoning-gym has {len(names)} datasets, e.g. {', '.join(names[:5])} (all: docs/reasoning-gym.md)"
    return ValueError(f"{key}={name}: not a Reasoning Gym dataset; {hint}")


def _config_object(name: str, settings: dict[str, Any], size: int, seed: int, key: str) -> Any:
    """The dataset's config dataclass built from ``settings`` and validated (its own asserts), or a ValueError
    naming the setting."""
    config_cls = _registry()[name][1]
    fields = [f.name for f in dataclasses.fields(config_cls)]
    for k, v in settings.items():
        if k in OWN_KEYS:
            raise ValueError(f"{key}.{k}={_show(v)}: set env.kwargs.{k} instead (the env's {k} is every dataset's)")
        if k not in fields:
            close = difflib.get_close_matches(k, fields, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else \
                f"its settings: {', '.join(f for f in fields if f not in OWN_KEYS)}"
            raise ValueError(f"{key}.{k}={_show(v)}: not a setting of the Reasoning Gym dataset {name!r}; {hint}")
    try:
        config = config_cls(**settings, size=size, seed=seed)
        if callable(getattr(config, "validate", None)):
            config.validate()
    except Exception as exc:  # noqa: BLE001  (the dataset's own asserts and type errors)
        why = str(exc) or type(exc).__name__
        raise ValueError(f"{key}={_show(settings)}: the Reasoning Gym dataset {name!r} refuses these settings: "
                         f"{why}") from None
    return config


def make_spec(dataset: Any, config: Any = None, size: Any = 1000, seed: Any = 0) -> Spec:
    """Check the env's dataset keys and return their :class:`Spec`. Raises ``ValueError`` whose message starts
    with the offending key (``dataset=...``, ``config.max_animal=...``), as the config check prints it after
    ``env.kwargs.``."""
    dataset, config = plain(dataset), plain(config)
    for key, value, low in (("size", size, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value}: must be an integer >= {low}")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ValueError(f"config={_show(config)}: must be a mapping of the dataset's settings, e.g. "
                         "env.kwargs.config={max_animals:3}")
    if dataset is None:
        raise ValueError("dataset=null: required: a Reasoning Gym dataset name (e.g. leg_counting) or a mapping of "
                         "names to weights (e.g. {leg_counting:1,spell_backward:3})")
    if isinstance(dataset, str):
        if dataset not in _registry() or dataset == "composite":
            raise _unknown_dataset(dataset, "dataset")
        _config_object(dataset, dict(config), size, seed, "config")
        _check_hash_seed([dataset])
        return Spec((dataset,), None, json.dumps(config, sort_keys=True, default=str), size, seed)
    if not isinstance(dataset, Mapping) or not dataset:
        raise ValueError(f"dataset={_show(dataset)}: must be a dataset name (e.g. leg_counting) or a non-empty "
                         "mapping of names to weights (e.g. {leg_counting:1,spell_backward:3})")
    names, weights = [], []
    for name, weight in dataset.items():
        if name not in _registry() or name == "composite":
            raise _unknown_dataset(name, "dataset")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight <= 0:
            raise ValueError(f"dataset.{name}={weight}: a weight must be a number > 0")
        names.append(name)
        weights.append(float(weight))
    for name, settings in config.items():
        if name not in dataset:
            close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"the mix holds {', '.join(names)}"
            raise ValueError(f"config.{name}={_show(settings)}: with a mix of datasets, config holds one mapping per "
                             f"dataset of the mix; {hint}")
        if not isinstance(settings, Mapping):
            raise ValueError(f"config.{name}={_show(settings)}: must be a mapping of {name}'s settings")
        _config_object(name, dict(settings), size, seed, f"config.{name}")
    _check_hash_seed(names)
    return Spec(tuple(names), tuple(weights), json.dumps(config, sort_keys=True, default=str), size, seed)


def _check_hash_seed(names: list[str]) -> None:
    hashed = [n for n in names if n in HASH_DEPENDENT]
    if hashed and not os.environ.get("PYTHONHASHSEED", "").isdigit():
        raise ValueError(f"dataset={hashed[0]}: its items depend on Python's string hashing, so the trainer's "
                         "processes would generate different items for one task id; run with a fixed hash seed "
                         "(PYTHONHASHSEED=0 openmanus-rl ...)")


_LOCK = threading.Lock()  # envs are built concurrently: one build per dataset


def build(spec: Spec) -> Any:
    """The ``ProceduralDataset`` of ``spec`` (cached per process: the trainer builds one env per episode)."""
    with _LOCK:
        return _build(spec)


@lru_cache(maxsize=16)
def _build(spec: Spec) -> Any:
    import reasoning_gym

    settings = spec.settings()
    if spec.weights is None:
        return reasoning_gym.create_dataset(spec.names[0], size=spec.size, seed=spec.seed, **settings)
    from reasoning_gym.composite import DatasetSpec

    parts = [DatasetSpec(name=n, weight=w, config=dict(settings.get(n, {})))
             for n, w in zip(spec.names, spec.weights)]
    return reasoning_gym.create_dataset("composite", size=spec.size, seed=spec.seed, datasets=parts)


@lru_cache(maxsize=4096)
def item(spec: Spec, index: int) -> dict[str, Any]:
    """Item ``index`` of the dataset (``question``, ``answer``, ``metadata``): the same in every process (for
    :data:`HASH_DEPENDENT` datasets, under one ``PYTHONHASHSEED``). Callers copy it before handing it out."""
    return build(spec)[int(index)]


@lru_cache(maxsize=16)
def has_answers(spec: Spec) -> bool:
    """Whether the items carry a reference answer (``answer`` a string): some datasets (``rush_hour``,
    ``graph_color``, ...) check a solution instead, and have no oracle."""
    ds = build(spec)
    parts = list(ds.datasets.values()) if spec.weights is not None else [ds]
    return all(isinstance(part[0].get("answer"), str) for part in parts)
