"""The per-environment spec table (``envs.yaml``), read by the client and the launcher.

``get_spec(name)`` returns an :class:`EnvSpec`: ``defaults``, then the env's protocol block, then the env's own
entry, then any overrides the caller passes. Field meanings are documented at the top of ``envs.yaml``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

SPEC_FILE = Path(__file__).with_name("envs.yaml")


@dataclass(frozen=True)
class EnvSpec:
    """How to talk to (and start) one AgentGym environment server."""

    name: str
    protocol: str
    id_key: str
    create_id_path: str
    create_body: Any
    prefix: str
    reset_index_key: str
    reset_extra: Mapping[str, Any]
    reset_observation: str
    step_observation: str
    reward_key: str
    reward_cumulative: bool
    reward_scale: float
    done_key: tuple[str, ...]
    success_threshold: float | None
    has_close: bool | None
    health_path: str
    default_port: int
    data_range: tuple[int, int | None]
    command: str | list[str] | None
    health_timeout: float
    instruction: str

    @property
    def num_tasks(self) -> int | None:
        """How many data indices the server accepts; None when it accepts any index from ``data_range[0]`` on."""
        start, end = self.data_range
        return None if end is None else end - start


FIELD_NAMES = tuple(f.name for f in fields(EnvSpec))


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    with open(SPEC_FILE, encoding="utf-8") as f:
        table = yaml.safe_load(f)
    for key in ("defaults", "protocols", "envs"):
        if not isinstance(table.get(key), dict):
            raise ValueError(f"{SPEC_FILE}: top-level key {key!r} must be a mapping")
    return table


def env_names() -> list[str]:
    """Every AgentGym environment name the table knows, sorted."""
    return sorted(_table()["envs"])


def protocols() -> list[str]:
    return sorted(_table()["protocols"])


def get_spec(name: str, protocol: str | None = None, overrides: Mapping[str, Any] | None = None) -> EnvSpec:
    """The spec of env ``name``; ``protocol`` switches the request shape, ``overrides`` replace single fields.

    Raises ``KeyError`` for an unknown env name (with close matches) and ``ValueError`` for a bad field.
    """
    table = _table()
    envs = table["envs"]
    if name not in envs:
        close = difflib.get_close_matches(str(name), list(envs), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown AgentGym env {name!r}.{hint} Known: {', '.join(sorted(envs))} ({SPEC_FILE}).")
    entry = dict(envs[name])
    own = entry.get("protocol")
    proto = protocol or own
    if proto not in table["protocols"]:
        raise ValueError(
            f"AgentGym env {name!r}: protocol {proto!r} is not one of {protocols()}; "
            f"pass protocol='id' or protocol='env_idx'."
        )
    merged: dict[str, Any] = dict(table["defaults"])
    if proto == own:
        merged.update(table["protocols"][proto])
        merged.update(entry)
    else:
        # A different request shape than the env's own: the shape's id fields replace the env's.
        merged.update(entry)
        merged.update(table["protocols"][proto])
    merged["protocol"] = proto
    if overrides:
        unknown = sorted(set(overrides) - set(FIELD_NAMES) - {"name"})
        if unknown:
            raise ValueError(
                f"AgentGym env {name!r}: unknown spec field(s) {unknown}; fields are {', '.join(FIELD_NAMES)}."
            )
        merged.update(overrides)
    merged["name"] = name
    return _build(merged)


def _build(d: dict[str, Any]) -> EnvSpec:
    name = d["name"]

    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"AgentGym env {name!r}: field {field!r} = {d.get(field)!r} {why}")

    missing = [f for f in FIELD_NAMES if f not in d]
    if missing:
        raise ValueError(f"AgentGym env {name!r}: spec is missing {missing} (check {SPEC_FILE}).")
    rng = d["data_range"]
    if not (isinstance(rng, (list, tuple)) and len(rng) == 2 and isinstance(rng[0], int)
            and (rng[1] is None or isinstance(rng[1], int))):
        raise bad("data_range", "must be [start, end] integers (end null: no upper bound)")
    if not (0 <= rng[0] and (rng[1] is None or rng[0] < rng[1])):
        raise bad("data_range", "must satisfy 0 <= start < end")
    if d["has_close"] not in (None, True, False):
        raise bad("has_close", "must be true, false or null (null: read it from the server's OpenAPI schema)")
    done = d["done_key"]
    done_keys = (done,) if isinstance(done, str) else tuple(done)
    if not done_keys or not all(isinstance(k, str) and k for k in done_keys):
        raise bad("done_key", "must be a key or a list of keys")
    if not isinstance(d["reset_extra"] or {}, Mapping):
        raise bad("reset_extra", "must be a mapping")
    prefix = str(d["prefix"] or "").rstrip("/")
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    health = str(d["health_path"] or "/")
    if not health.startswith("/"):
        health = "/" + health
    threshold = d["success_threshold"]
    return EnvSpec(
        name=name,
        protocol=str(d["protocol"]),
        id_key=str(d["id_key"]),
        create_id_path=str(d["create_id_path"] or ""),
        create_body=d["create_body"],
        prefix=prefix,
        reset_index_key=str(d["reset_index_key"]),
        reset_extra=dict(d["reset_extra"] or {}),
        reset_observation=str(d["reset_observation"] if d["reset_observation"] is not None else ""),
        step_observation=str(d["step_observation"] if d["step_observation"] is not None else ""),
        reward_key=str(d["reward_key"]),
        reward_cumulative=bool(d["reward_cumulative"]),
        reward_scale=float(d["reward_scale"]),
        done_key=done_keys,
        success_threshold=None if threshold is None else float(threshold),
        has_close=d["has_close"],
        health_path=health,
        default_port=int(d["default_port"]),
        data_range=(int(rng[0]), None if rng[1] is None else int(rng[1])),
        command=d["command"],
        health_timeout=float(d["health_timeout"]),
        instruction=str(d["instruction"] or ""),
    )
