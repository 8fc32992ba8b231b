"""A Python function as an OpenAI function schema, and a call's arguments checked against it.

The schema is the one Hugging Face's ``transformers.utils.get_json_schema`` writes for a function with type hints and
a Google-style docstring (the shape chat templates expect), made lenient: an argument without a description has none,
one without a type hint takes any JSON value. The description is the docstring up to its ``Args:`` / ``Returns:`` /
``Raises:`` section; each ``name: text`` (or ``name (type): text``) line of ``Args:`` describes that argument. A
return hint that can be written as a schema is the function's ``return`` (with the ``Returns:`` text).

==========================================  ====================================================================
type hint                                   schema
==========================================  ====================================================================
``str`` ``int`` ``float`` ``bool`` ``None``  ``{"type": "string" | "integer" | "number" | "boolean" | "null"}``
``list[X]``, ``tuple[X, Y]``                ``{"type": "array", "items": X}``, ``{"type": "array", "prefixItems": [X, Y]}``
``dict[str, X]``                            ``{"type": "object", "additionalProperties": X}``
``Literal["a", 1]``                         ``{"type": ["string", "integer"], "enum": ["a", 1]}``
``X | None``, ``Optional[X]``               X's schema with ``"nullable": true``
``X | Y``                                   ``{"type": [...]}`` for plain types, else ``{"anyOf": [X, Y]}``
``Any``, no hint                            ``{}`` (any value)
==========================================  ====================================================================

Any other hint (a class of the user's) cannot be written as a schema: :class:`SchemaError`.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Union

__all__ = ["SchemaError", "function_schema", "check_value", "describe"]

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_PLAIN = {**_SCALARS, list: "array", tuple: "array", dict: "object"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Yields|Examples?)\s*:\s*$", re.M)
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class SchemaError(ValueError):
    """A tool's signature that cannot be written as a function schema."""


def _hint_schema(hint: Any) -> dict[str, Any]:
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        if hint in _PLAIN:
            return {"type": _PLAIN[hint]}
        raise SchemaError(f"{getattr(hint, '__name__', hint)!s}")
    if origin is Union or origin is getattr(types, "UnionType", ()):
        subs = [_hint_schema(a) for a in args if a is not type(None)]
        if len(subs) == 1:
            out = dict(subs[0])
        elif all(set(s) == {"type"} and isinstance(s["type"], str) for s in subs):
            names = sorted({s["type"] for s in subs})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": subs}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is Literal:
        if not args or any(type(a) not in _SCALARS for a in args):
            raise SchemaError(f"{hint}")
        kinds = list(dict.fromkeys(_SCALARS[type(a)] for a in args))
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _hint_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or Ellipsis in args:
            raise SchemaError(f"{hint} (use list[...] for a list of any length)")
        return {"type": "array", "prefixItems": [_hint_schema(a) for a in args]}
    if origin is dict:
        return {"type": "object", "additionalProperties": _hint_schema(args[1])} if len(args) == 2 else \
            {"type": "object"}
    raise SchemaError(f"{hint}")


def _docstring(doc: str) -> tuple[str, dict[str, str], str | None]:
    """``(description, {argument: description}, what it returns)`` of a Google-style docstring."""
    sections = list(_SECTION.finditer(doc))
    description = doc[: sections[0].start()].strip() if sections else doc.strip()
    args: dict[str, str] = {}
    returns = None
    for i, sec in enumerate(sections):
        body = doc[sec.end(): sections[i + 1].start() if i + 1 < len(sections) else len(doc)]
        if sec.group(1) == "Returns":
            returns = body.strip() or None
        if sec.group(1) not in ("Args", "Arguments"):
            continue
        name = None
        for line in body.splitlines():
            m = _ARG_LINE.match(line)
            if m and (name is None or len(line) - len(line.lstrip()) <= indent):
                name, indent = m.group(1).lstrip("*"), len(line) - len(line.lstrip())
                args[name] = m.group(2).strip()
            elif name is not None and line.strip():
                args[name] = f"{args[name]} {line.strip()}".strip()
    return description, args, returns


def function_schema(name: str, fn: Callable[..., Any], bound: bool = True) -> dict[str, Any]:
    """The OpenAI function schema of ``fn`` (module docstring); ``bound``: its first parameter (``self``) is left
    out. :class:`SchemaError` names the parameter whose hint cannot be written as a schema, or one that cannot be
    given by name."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001  (a hint that does not resolve: the names are still tools' arguments)
        hints = {}
    description, arg_docs, returns = _docstring(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for i, p in enumerate(sig.parameters.values()):
        if bound and i == 0:
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            raise SchemaError(f"{name}(...): its parameter {p.name} cannot be given by name (a tool's arguments are)")
        try:
            prop = _hint_schema(hints.get(p.name, p.annotation))
        except SchemaError as exc:
            raise SchemaError(f"{name}({p.name}: {exc}): the type hint cannot be written as a JSON schema; use str, "
                              "int, float, bool, None, list, tuple, dict, Literal, Any or a Union of them") from None
        if arg_docs.get(p.name):
            prop["description"] = arg_docs[p.name]
        properties[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    out: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if "return" in hints:  # what the tool returns, where the hint can be written as a schema (some templates show it)
        try:
            out["return"] = _hint_schema(hints["return"])
        except SchemaError:
            pass
        else:
            if returns:
                out["return"]["description"] = returns
    return {"type": "function", "function": out}


def describe(schema: dict[str, Any]) -> str:
    """A schema in a few words, for a message: ``an integer``, ``one of 'a', 'b'``, ``a list``..."""
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(describe(s) for s in schema["anyOf"])
    kinds = schema.get("type")
    if kinds is None:
        return "any value"
    words = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
             "null": "null", "array": "a list", "object": "an object"}
    text = " or ".join(words.get(k, k) for k in ([kinds] if isinstance(kinds, str) else kinds))
    return f"{text} or null" if schema.get("nullable") else text


def _is(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "null": type(None), "array": list,
                              "object": dict}.get(kind, object))


def check_value(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """Why ``value`` (decoded JSON) does not fit ``schema``, or None when it does (module docstring's subset)."""
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        ok = any(check_value(value, s, where) is None for s in schema["anyOf"])
        return None if ok else f"{where} must be {describe(schema)}, got {_short(value)}"
    if "enum" in schema:
        ok = any(v == value and _is(_SCALARS[type(v)], value) for v in schema["enum"])
        return None if ok else f"{where} must be {describe(schema)}, got {_short(value)}"
    kinds = schema.get("type")
    if kinds is not None and not any(_is(k, value) for k in ([kinds] if isinstance(kinds, str) else kinds)):
        return f"{where} must be {describe(schema)}, got {_short(value)}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            why = check_value(item, schema["items"], f"{where}[{i}]")
            if why:
                return why
    if isinstance(value, list) and "prefixItems" in schema:
        if len(value) != len(schema["prefixItems"]):
            return f"{where} must be a list of {len(schema['prefixItems'])} items, got {len(value)}"
        for i, (item, sub) in enumerate(zip(value, schema["prefixItems"])):
            why = check_value(item, sub, f"{where}[{i}]")
            if why:
                return why
    if isinstance(value, dict) and "additionalProperties" in schema:
        for key, item in value.items():
            why = check_value(item, schema["additionalProperties"], f"{where}[{key!r}]")
            if why:
                return why
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
