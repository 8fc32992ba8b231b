"""What an OpenAI request asks its reply to be, as a decoding constraint (``engines/constrained.py``).

:func:`request_constraint` reads a request's

- ``tool_choice`` (Chat Completions: ``"none" | "auto" | "required" | {"type": "function", "function": {"name"}}``;
  Responses: ``{"type": "function", "name"}``) with its ``tools`` (Chat's ``{"type": "function", "function":
  {"name", "parameters"}}`` or Responses' flat ``{"type": "function", "name", "parameters"}``) and
  ``parallel_tool_calls``;
- ``response_format`` (Chat: ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}``) or ``text.format`` (Responses: ``{"type": "json_schema", "name", "schema", "strict"}``,
  ``{"type": "json_object"}``);

and gives the :class:`~openmanus_rl_core.protocols.Constraint` the engine decodes under, or None (free text):

=====================================  ==========================================================================
request                                constraint
=====================================  ==========================================================================
``required``                           one tool call of any tool (``parallel_tool_calls``, OpenAI's default true:
                                       one or more), in the model family's wrapper, and nothing else
a named function                       one call (or several) of that function only
``auto`` (or unset) with tools         None; with a JSON response format: a tool call or a JSON reply
``none``                               None: the server renders the prompt WITHOUT the tools and parses no tool
                                       calls from the reply (so the model is not shown tools it may not call);
                                       a response format still applies
``json_object``                        one JSON object
``json_schema`` (strict or not)        one JSON value valid against the schema (``strict`` changes nothing: the
                                       schema is enforced either way)
``text`` / no format                   None
=====================================  ==========================================================================

A bad value is an :class:`~openmanus_rl_core.gateway.requests.ApiError` 400 that names the field (``param``): an
invalid JSON schema (checked against its metaschema by ``jsonschema``, then compiled by llguidance, which refuses
what it does not support), an unknown type, a named function that is not among the tools, ``required`` without
tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from openmanus_rl_core.engines.constrained import (
    HERMES, ToolCallFormat, any_of, grammar_error, json_object_constraint, json_schema_constraint, tool_call_constraint,
)
from openmanus_rl_core.gateway.requests import ApiError
from openmanus_rl_core.protocols import Constraint

__all__ = ["request_constraint", "tools_in_prompt", "function_tools"]


def tools_in_prompt(tool_choice: Any) -> bool:
    """Whether the prompt shows the request's tools: not with ``tool_choice="none"`` (see the module doc)."""
    return tool_choice != "none"


def function_tools(tools: Sequence[Any] | None, param: str = "tools") -> list[dict[str, Any]]:
    """``[{"name", "parameters"}]`` of a request's function tools, in Chat's or Responses' shape; each
    ``parameters`` schema checked (400 naming ``tools[i]...`` when invalid). Tools of other types are skipped."""
    out = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, Mapping):
            raise ApiError(400, f"{param}[{i}] must be an object, not {tool!r}", param=f"{param}[{i}]")
        if tool.get("type", "function") != "function":
            continue
        fn, where = (tool["function"], f"{param}[{i}].function") if isinstance(tool.get("function"), Mapping) else (
            tool, f"{param}[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"{where}.name must be a non-empty string, not {name!r}", param=f"{where}.name")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        _check_schema(params, f"{where}.parameters")
        out.append({"name": name, "parameters": dict(params)})
    return out


def _check_schema(schema: Any, param: str) -> None:
    """400 naming ``param`` unless ``schema`` is a valid JSON schema (its metaschema) that llguidance compiles."""
    import jsonschema

    if not isinstance(schema, Mapping):
        raise ApiError(400, f"{param} must be a JSON schema object, not {schema!r}", param=param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ApiError(400, f"{param} is not a valid JSON schema: {exc.message}" + (f" (at {where})" if where else ""),
                       param=param) from None
    error = grammar_error(json_schema_constraint(dict(schema)))
    if error:
        raise ApiError(400, f"{param} is not supported by constrained decoding: {error}", param=param)


# the response formats that carry no schema of their own: the schema each asks for (None: free text)
_PLAIN_FORMATS: dict[str, dict[str, Any] | None] = {"text": None, "json_object": {"type": "object"}}


def _format_schema(fmt: Any, param: str, chat: bool) -> dict[str, Any] | None:
    """The JSON schema a response format asks for (``{"type": "object"}`` for json_object), or None for text."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ApiError(400, f"{param} must be an object, not {fmt!r}", param=param)
    kind = fmt.get("type")
    if kind in _PLAIN_FORMATS:
        plain = _PLAIN_FORMATS[kind]
        return None if plain is None else dict(plain)
    if kind != "json_schema":
        raise ApiError(400, f"{param}.type must be one of text, json_object, json_schema, not {kind!r}",
                       param=f"{param}.type")
    body, where = (fmt.get("json_schema"), f"{param}.json_schema") if chat else (fmt, param)
    if not isinstance(body, Mapping):
        raise ApiError(400, f"{where} must be an object with a schema, not {body!r}", param=where)
    schema = body.get("schema")
    if schema is None:
        raise ApiError(400, f"{where}.schema is missing", param=f"{where}.schema")
    _check_schema(schema, f"{where}.schema")
    return dict(schema)


def _chosen_name(tool_choice: Mapping) -> str | None:
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
    return name if isinstance(name, str) else None


def request_constraint(tools: Sequence[Any] | None = None, tool_choice: Any = None, response_format: Any = None,
                       text_format: Any = None, parallel_tool_calls: bool | None = None,
                       tool_format: ToolCallFormat = HERMES) -> Constraint | None:
    """The constraint of one request (see the module doc), or None when the reply is free text.

    ``response_format``: Chat Completions' field; ``text_format``: the Responses API's ``text.format`` (give one
    of the two). ``parallel_tool_calls``: None is OpenAI's default (true). ``tool_format``: how the served model's
    family writes a call (``engines/constrained.py``: :data:`HERMES` for Hermes/Qwen and the embedded default).
    """
    if response_format is not None and text_format is not None:
        raise ApiError(400, "give response_format (Chat Completions) or text.format (Responses), not both",
                       param="response_format")
    schema = (_format_schema(response_format, "response_format", chat=True) if response_format is not None
              else _format_schema(text_format, "text.format", chat=False))
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    fns = function_tools(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, Mapping):
        if choice.get("type") != "function":
            raise ApiError(400, f"tool_choice.type must be 'function', not {choice.get('type')!r}",
                           param="tool_choice")
        name = _chosen_name(choice)
        chosen = [t for t in fns if t["name"] == name]
        if not chosen:
            raise ApiError(400, f"tool_choice names function {name!r}, which is not among the request's tools "
                           f"({', '.join(t['name'] for t in fns) or 'none'})", param="tool_choice")
        return tool_call_constraint(chosen, tool_format, parallel)
    rule = _CHOICES.get(choice) if isinstance(choice, str) else None
    if rule is None:
        raise ApiError(400, f"tool_choice must be none, auto, required or a function, not {choice!r}",
                       param="tool_choice")
    return rule(fns, schema, tool_format, parallel)


def _required(fns: list, schema: Any, tool_format: Any, parallel: bool) -> Constraint:
    if not fns:
        raise ApiError(400, "tool_choice='required' needs at least one function in tools", param="tool_choice")
    return tool_call_constraint(fns, tool_format, parallel)


def _auto(fns: list, schema: Any, tool_format: Any, parallel: bool) -> Constraint | None:
    if schema is None:
        return None
    return any_of(fns, schema, tool_format, parallel) if fns else _schema_constraint(schema)


def _none(fns: list, schema: Any, tool_format: Any, parallel: bool) -> Constraint | None:
    return None if schema is None else _schema_constraint(schema)


_CHOICES = {"required": _required, "auto": _auto, "none": _none}
"""A named ``tool_choice``: what the reply must be, from the request's functions and its response format's schema."""


def _schema_constraint(schema: dict[str, Any]) -> Constraint:
    return json_object_constraint() if schema == {"type": "object"} else json_schema_constraint(schema)
