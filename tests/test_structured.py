"""A request's tool_choice / response_format / text.format as a decoding constraint
(openmanus_rl_core/gateway/structured.py)."""

from __future__ import annotations

import json

import pytest

from openmanus_rl_core.engines.constrained import grammar_error, to_lark
from openmanus_rl_core.gateway.requests import ApiError
from openmanus_rl_core.gateway.structured import function_tools, request_constraint, tools_in_prompt

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "search", "description": "web",
                                                "parameters": {"type": "object",
                                                               "properties": {"q": {"type": "string"}},
                                                               "required": ["q"]}}},
              {"type": "function", "function": {"name": "now"}}]
RESPONSES_TOOLS = [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}}}, {"type": "web_search_preview"}]


def _refused(**kw) -> ApiError:
    with pytest.raises(ApiError) as info:
        request_constraint(**kw)
    assert info.value.status == 400
    return info.value


def test_no_constraint_for_free_text():
    assert request_constraint() is None
    assert request_constraint(tools=CHAT_TOOLS) is None
    assert request_constraint(tools=CHAT_TOOLS, tool_choice="auto") is None
    assert request_constraint(tools=CHAT_TOOLS, tool_choice="none") is None
    assert request_constraint(response_format={"type": "text"}) is None
    assert request_constraint(text_format={"type": "text"}) is None


def test_none_keeps_tools_out_of_the_prompt():
    assert tools_in_prompt("none") is False
    assert tools_in_prompt("auto") is tools_in_prompt(None) is tools_in_prompt("required") is True


def test_json_object_and_json_schema():
    c = request_constraint(response_format={"type": "json_object"})
    assert c.json_schema == {"type": "object"} and c.name == "json_object"
    c = request_constraint(response_format={"type": "json_schema",
                                            "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert c.json_schema == PERSON
    not_strict = request_constraint(response_format={"type": "json_schema", "json_schema": {"name": "p",
                                                                                            "schema": PERSON}})
    assert not_strict.json_schema == PERSON  # the schema is enforced with or without strict
    responses = request_constraint(text_format={"type": "json_schema", "name": "person", "schema": PERSON,
                                                "strict": True})
    assert responses.json_schema == PERSON
    # none with a format: no tool call, but the format holds
    assert request_constraint(tools=CHAT_TOOLS, tool_choice="none",
                              response_format={"type": "json_object"}).json_schema == {"type": "object"}


def test_required_and_named_tool_choice_build_tool_call_grammars():
    req = request_constraint(tools=CHAT_TOOLS, tool_choice="required")
    assert req.name == "tool_call:search,now" and grammar_error(req) is None
    assert '"<tool_call>\\n" call_json "\\n</tool_call>"' in req.lark
    assert '{"const": "search"}' in req.lark and '{"const": "now"}' in req.lark
    assert "(\"\\n\" call)*" in req.lark  # parallel_tool_calls defaults to true
    single = request_constraint(tools=CHAT_TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert ")*" not in single.lark
    named = request_constraint(tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "now"}})
    assert named.name == "tool_call:now" and '"search"' not in named.lark
    # Responses API: flat tools and a flat named choice; non-function tools are not callable by the grammar
    flat = request_constraint(tools=RESPONSES_TOOLS, tool_choice={"type": "function", "name": "search"})
    assert flat.name == "tool_call:search"
    assert [t["name"] for t in function_tools(RESPONSES_TOOLS)] == ["search"]


def test_auto_with_a_format_is_a_tool_call_or_the_json():
    c = request_constraint(tools=CHAT_TOOLS, tool_choice="auto", text_format={"type": "json_schema", "name": "p",
                                                                              "schema": PERSON})
    assert c.lark.startswith("start: calls | answer") and grammar_error(c) is None
    body = to_lark(c).split("answer: %json ", 1)[1]
    assert json.loads(body)["properties"] == PERSON["properties"]


@pytest.mark.parametrize("kw,param,words", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "strin"}}}),
     "response_format.json_schema.schema", "not a valid JSON schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"a": {"minLength": "x"}}}}}),
     "response_format.json_schema.schema", "at properties/a/minLength"),
    (dict(text_format={"type": "json_schema", "name": "p", "schema": "{}"}), "text.format.schema",
     "must be a JSON schema object"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "p"}}),
     "response_format.json_schema.schema", "is missing"),
    (dict(response_format={"type": "yaml"}), "response_format.type", "'yaml'"),
    (dict(tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "fly"}}), "tool_choice",
     "'fly', which is not among the request's tools (search, now)"),
    (dict(tool_choice="required"), "tool_choice", "needs at least one function"),
    (dict(tools=CHAT_TOOLS, tool_choice="sometimes"), "tool_choice", "'sometimes'"),
    (dict(tools=[{"type": "function", "function": {"name": "bad", "parameters": {"type": 3}}}],
          tool_choice="required"), "tools[0].function.parameters", "not a valid JSON schema"),
    (dict(response_format={"type": "json_object"}, text_format={"type": "json_object"}), "response_format",
     "not both"),
])
def test_bad_requests_are_400s_naming_the_field(kw, param, words):
    err = _refused(**kw)
    assert err.param == param
    assert words in err.message and "\n" not in err.message


def test_a_schema_the_grammar_engine_cannot_compile_is_a_400():
    # valid JSON schema, but a regular expression with a look-ahead, which llguidance's regexes do not have
    err = _refused(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "string", "pattern": "^(?=a)a+$"}}})
    assert err.param == "response_format.json_schema.schema"
    assert "not supported by constrained decoding" in err.message
