"""An OpenEnv env's ``/schema`` as text and back: the prompt's description of the action, a reply turned into the
action's JSON, the observation as text, and a validation error as the observation the model reads next.

The action schema is pydantic's JSON schema of the env's ``Action`` class. Its ``metadata`` field (every OpenEnv
action has one) is left out: the model never sets it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["Field", "action_fields", "text_field", "describe_action", "to_action", "observation_text",
           "observation_fields", "validation_message"]

_HIDDEN = ("metadata",)
_INT = re.compile(r"[+-]?\d+")
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


@dataclass(frozen=True)
class Field:
    """One field of the action: its name, JSON-schema node, whether it is required, and its text for the prompt."""

    name: str
    node: Mapping[str, Any]
    required: bool
    kind: str  # "string", "integer", "integer or null", "one of 'a', 'b'", "array of string", ...
    description: str

    @property
    def default(self) -> Any:
        return self.node.get("default")


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return defs.get(ref.rsplit("/", 1)[1], {})
    return node


def _kind(node: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    node = _resolve(node, defs)
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        return " or ".join(dict.fromkeys(_kind(o, defs) for o in options))
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        items = node.get("items")
        return f"array of {_kind(items, defs)}" if isinstance(items, Mapping) else "array"
    if kind == "object" or "properties" in node:
        return f"object ({node['title']})" if node.get("title") else "object"
    return str(kind or "any value")


def action_fields(action_schema: Mapping[str, Any]) -> list[Field]:
    """The action's fields in the schema's order, ``metadata`` left out."""
    defs = action_schema.get("$defs") or {}
    required = set(action_schema.get("required") or ())
    out = []
    for name, node in (action_schema.get("properties") or {}).items():
        if name in _HIDDEN or not isinstance(node, Mapping):
            continue
        out.append(Field(name, node, name in required, _kind(node, defs), str(node.get("description") or "")))
    return out


def text_field(fields: Sequence[Field]) -> Field | None:
    """The field a plain-text reply fills: the one required field, or the only field when none is required."""
    required = [f for f in fields if f.required]
    if len(required) == 1:
        return required[0]
    if not required and len(fields) == 1:
        return fields[0]
    return None


def describe_action(title: str, fields: Sequence[Field]) -> str:
    """The prompt's account of the action: each field with its type, whether it is required, and its description;
    then how to write it."""
    if not fields:
        return f"Your action is the env's {title}: it has no fields; reply with {{}}."
    lines = [f"Your action is the env's {title}, with these fields:"]
    for f in fields:
        need = "required" if f.required else ("optional" if f.default is None
                                               else f"optional, default {json.dumps(f.default)}")
        lines.append(f"- {f.name} ({f.kind}, {need})" + (f": {f.description}" if f.description else ""))
    example = "{" + ", ".join(f'"{f.name}": ...' for f in fields if f.required or len(fields) == 1) + "}"
    how = f"Write the action as a JSON object of its fields, e.g. {example}"
    one = text_field(fields)
    if one is not None:
        how += f"; or write the value of {one.name} alone, as plain text"
    return "\n".join(lines + [how + "."])


def _coerce(text: str, node: Mapping[str, Any], defs: Mapping[str, Any]) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` reads as a value of ``node``'s type, else ``(False, None)``."""
    node = _resolve(node, defs)
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        for option in options:
            if _resolve(option, defs).get("type") == "null":
                continue
            ok, value = _coerce(text, option, defs)
            if ok:
                return True, value
        return False, None
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    s = text.strip()
    if "string" in kinds or (kind is None and "enum" in node and all(isinstance(v, str) for v in node["enum"])):
        return True, s
    if "integer" in kinds and _INT.fullmatch(s):
        return True, int(s)
    if "number" in kinds:
        try:
            return True, float(s)
        except ValueError:
            pass
    if "boolean" in kinds and s.lower() in _TRUE + _FALSE:
        return True, s.lower() in _TRUE
    if {"array", "object"} & set(kinds) or kind is None:
        try:
            return True, json.loads(s)
        except ValueError:
            pass
    return False, None


def to_action(text: str, action_schema: Mapping[str, Any], fields: Sequence[Field]) -> tuple[dict | None, str]:
    """The action's JSON for a reply: ``(payload, "")``, or ``(None, why)`` when the reply gives no action.

    A reply that is a JSON object naming at least one of the action's fields is the action itself. Otherwise, for
    an action with one text field (:func:`text_field`), the reply is that field's value, coerced to its type (a
    value that does not read as its type is sent as the text: the server's validation answers it)."""
    s = text.strip()
    names = {f.name for f in fields}
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and (set(obj) & names or not names):
            return obj, ""
    one = text_field(fields)
    if one is None:
        shape = ", ".join(f'"{f.name}"' for f in fields if f.required)
        return None, (f"Invalid action: write it as a JSON object with the fields {shape} "
                      f"(got {s[:80]!r}).")
    ok, value = _coerce(s, one.node, action_schema.get("$defs") or {})
    return {one.name: value if ok else s}, ""


def observation_fields(observation_schema: Mapping[str, Any]) -> list[str]:
    """The names an observation shows (``done``, ``reward`` and ``metadata`` travel apart from it)."""
    return [n for n in (observation_schema.get("properties") or {}) if n not in ("done", "reward", "metadata")]


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def observation_text(observation: Mapping[str, Any], field: str | None = None) -> str:
    """The observation's fields as ``name: value`` lines (strings as they are, other values as JSON), or the value
    of ``field`` alone."""
    if field is not None:
        return _value_text(observation.get(field, ""))
    return "\n".join(f"{k}: {_value_text(v)}" for k, v in observation.items())


def validation_message(errors: Any, fallback: str = "") -> str:
    """The observation after an action the env's Action model refused: each error as ``field: message``."""
    parts = []
    for e in errors if isinstance(errors, list) else []:
        if not isinstance(e, Mapping):
            continue
        loc = ".".join(str(x) for x in (e.get("loc") or ()) if x not in ("body", "action"))
        parts.append(f"{loc}: {e.get('msg', 'invalid')}" if loc else str(e.get("msg", "invalid")))
    return "Invalid action: " + ("; ".join(parts) if parts else (fallback or "the env refused it")) + "."
