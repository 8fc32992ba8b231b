"""The tool-calling templates (qwen_tools, llama3_tools, hermes_tools): each reads the call its family's own chat
template writes (the real templates in chat_templates/, rendered by transformers) as the canonical call text, writes
that very call back, and answers malformed calls as invalid actions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.protocols import ActionTemplate
from openmanus_rl_core.testing import check_template
from openmanus_rl_templates import HermesToolsTemplate, Llama3ToolsTemplate, QwenToolsTemplate, hooks
from openmanus_rl_templates.tool_calls import canonical, read_canonical

HERE = Path(__file__).parent
FAMILIES = {"qwen_tools": QwenToolsTemplate, "llama3_tools": Llama3ToolsTemplate, "hermes_tools": HermesToolsTemplate}
CHAT_TEMPLATES = {"qwen_tools": "qwen2_5_instruct.jinja", "llama3_tools": "llama3_1_json.jinja",
                  "hermes_tools": "hermes_tool_use.jinja"}
# Where each family's template puts an assistant turn: (its header, its end).
TURN = {"qwen_tools": ("<|im_start|>assistant", "<|im_end|>"),
        "llama3_tools": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
        "hermes_tools": ("<|im_start|>assistant", "<|im_end|>")}
CALLS = [
    ("heat", {"degrees": 3}),
    ("finish", {}),
    ("search", {"query": "a \"quoted\" {brace} [x]\nline two", "limit": 5, "exact": False, "lang": None}),
    ("move", {"path": [[0, 1], [2, 3]], "opts": {"speed": 1.5, "note": "ünïcödé 漢字 🙂"}}),
]
CANONICAL_ACTIONS = [canonical(n, a) for n, a in CALLS]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["hello world"], vocab_size=300)


def written_by_the_family_template(tokenizer, family: str, name: str, args: dict) -> str:
    """The assistant turn (header and end-of-turn marker left out) the family's real chat template writes for one
    call of ``name`` with ``args``."""
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
             "name": name, "arguments": args}}]}],
        chat_template=(HERE / "chat_templates" / CHAT_TEMPLATES[family]).read_text(), tokenize=False)
    head, end = TURN[family]
    turn = text[text.rindex(head) + len(head):]
    return turn[: turn.index(end)]


# ------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("family", FAMILIES)
def test_conformance_kit_with_text_actions_and_with_canonical_calls(family):
    check_template(FAMILIES[family](text_tool="act"))
    check_template(FAMILIES[family](text_tool="act"), actions=["open box", "7", "a {b} [c] \"d\" 'e'", "x\ny"])
    check_template(FAMILIES[family](), actions=CANONICAL_ACTIONS)


@pytest.mark.parametrize("family", FAMILIES)
def test_registered_with_a_config_and_a_tool_calling_template(family):
    cfg = yaml.safe_load((Path(hooks.__file__).parent / "configs" / "template" / f"{family}.yaml").read_text())
    assert cfg == {"name": family, "kwargs": {}}
    template = registry("template").build(family, **cfg["kwargs"])
    assert isinstance(template, FAMILIES[family]) and isinstance(template, ActionTemplate)
    assert template.calls_tools is True and template.tools is None and template.text_tool is None
    # the instruction alone: the model's chat template writes the tools and the call format
    assert template.system_prompt("  Heat the room.\n") == "Heat the room."
    assert FAMILIES[family](system="Task: {instruction}").system_prompt("x {y}") == "Task: x {y}"
    assert template.stop == ({"llama3_tools": []}.get(family, ["</tool_call>"]))
    with pytest.raises(ValueError, match=r"^text_tool='a b': must be a tool name"):
        FAMILIES[family](text_tool="a b")


# -------------------------------------------------------------------------------- the family's real format
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name,args", CALLS, ids=[c[0] for c in CALLS])
def test_each_parser_reads_the_call_its_familys_chat_template_writes_and_writes_it_back(tokenizer, family, name,
                                                                                        args):
    template = FAMILIES[family]()
    written = written_by_the_family_template(tokenizer, family, name, args)
    parsed = template.parse(written)
    assert parsed.valid and parsed.kind == "tool_call" and parsed.thought == ""
    assert parsed.content == canonical(name, args) and json.loads(parsed.content) == {"name": name, "arguments": args}
    # render writes the very call the family's template writes (around it: only the turn's whitespace)
    assert template.render(parsed.content) == written.strip()
    assert re.search(template.end_pattern, template.render(parsed.content))
    # the model's end-of-turn token after the call, as an engine that keeps special tokens returns it
    end = TURN[family][1]
    assert template.parse(written + end).content == parsed.content


def test_qwen3_thinks_before_its_call():
    reply = ('<think>\nThe room is at 16 and the target is 19, so heat by 3.\n</think>\n\n'
             '<tool_call>\n{"name": "heat", "arguments": {"degrees": 3}}\n</tool_call>')
    parsed = QwenToolsTemplate().parse(reply)
    assert (parsed.valid, parsed.content) == (True, '{"name": "heat", "arguments": {"degrees": 3}}')
    assert parsed.thought == "The room is at 16 and the target is 19, so heat by 3."
    # prose before a call is the thought too; a call the model ended its turn after, without the closing tag
    parsed = QwenToolsTemplate().parse('I will heat.\n<tool_call>\n{"name": "heat", "arguments": {"degrees": 1}}')
    assert (parsed.valid, parsed.thought, json.loads(parsed.content)["arguments"]) == (True, "I will heat.",
                                                                                        {"degrees": 1})


def test_hermes_reads_the_python_literal_calls_its_models_write():
    # the call in NousResearch's Hermes-Function-Calling README
    reply = "<tool_call>\n{'arguments': {'symbol': 'TSLA'}, 'name': 'get_current_stock_price'}\n</tool_call>"
    parsed = HermesToolsTemplate().parse(reply)
    assert parsed.valid and parsed.content == '{"name": "get_current_stock_price", "arguments": {"symbol": "TSLA"}}'
    parsed = HermesToolsTemplate().parse("<tool_call>{'name': 'f', 'arguments': {'on': True, 'x': None}}</tool_call>")
    assert parsed.content == '{"name": "f", "arguments": {"on": true, "x": null}}'


def test_llama_reads_a_call_after_python_tag_and_arguments_given_as_text():
    t = Llama3ToolsTemplate()
    parsed = t.parse('<|python_tag|>{"name": "heat", "parameters": {"degrees": 3}}<|eom_id|>')
    assert (parsed.valid, parsed.content, parsed.thought) == (True, canonical("heat", {"degrees": 3}), "")
    parsed = t.parse('Let me heat.\n{"name": "heat", "arguments": "{\\"degrees\\": 2}"}')
    assert (parsed.content, parsed.thought) == (canonical("heat", {"degrees": 2}), "Let me heat.")
    # the first object with a name is the call; an object before it without one is prose
    assert t.parse('use {} then {"name": "finish", "parameters": {}}; {"name": "x"}').content == canonical("finish", {})


# ------------------------------------------------------------------------------------------- malformed
MALFORMED = {
    "qwen_tools": [
        '{"name": "heat", "arguments": {"degrees": 3}}',                              # no tags: not Qwen's format
        '<tool_call>\n{"name": "heat", "arguments": {"degrees": 3}\n</tool_call>',     # unclosed object
        '<tool_call>\n{"name": "heat", "arguments": [3]}\n</tool_call>',               # arguments not an object
        '<tool_call>\n{"arguments": {"degrees": 3}}\n</tool_call>',                    # no name
        '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',                    # empty name
        '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',                     # name not a string
        '<tool_call>\n{"name": "heat", "arguments": {}} and more\n</tool_call>',       # junk after the object
        '<tool_call>heat(degrees=3)</tool_call>',                                      # not JSON
        "<tool_call>\n{'name': 'heat', 'arguments': {}}\n</tool_call>",               # a Python literal (Hermes only)
        '<tool_call>\n{"name": "heat", "arguments": "not json"}\n</tool_call>',        # arguments text not JSON
        '<tool_call>\n[{"name": "heat", "arguments": {}}]\n</tool_call>',              # a list of calls
        '<tool_call>\n{"name": "heat", "argu',                                         # cut off
        '<tool_call></tool_call>',
    ],
    "hermes_tools": [
        '{"arguments": {}, "name": "heat"}',
        '<tool_call>\n{ "arguments": {"degrees": 3, "name": "heat"}\n</tool_call>',
        "<tool_call>\n{'arguments': {'degrees': 3}, 'name': 'heat'\n</tool_call>",    # bad literal
        "<tool_call>\n__import__('os').system('echo hi')\n</tool_call>",               # code is never run
        "<tool_call>\n{'arguments': {'degrees': 3}, 'name': 'heat'}",                   # a literal needs the close tag
        '<tool_call>\n{"arguments": 3, "name": "heat"}\n</tool_call>',
        "<tool_call>\n{'arguments': {}, 'name': ''}\n</tool_call>",
        "<tool_call>\n{'arguments': {1, 2}, 'name': 'heat'}\n</tool_call>",
        "<tool_call>\n" + "[" * 5000 + "\n</tool_call>",
    ],
    "llama3_tools": [
        '{"name": "heat", "parameters": {"degrees": 3}',                               # unclosed
        '{"parameters": {"degrees": 3}}',                                              # no name
        '{"name": "heat", "parameters": [1]}',
        '{"name": "", "parameters": {}}',
        '<|python_tag|>brave_search.call(query="x")',                                  # a built-in tool: not JSON
        "I would heat the room by 3 degrees.",
        '{"name": "heat", "parameters": "{bad"}',
    ],
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_malformed_call_is_an_invalid_action_carrying_the_raw_reply(family):
    for template in (FAMILIES[family](), FAMILIES[family](text_tool="act")):
        for text in MALFORMED[family]:
            parsed = template.parse(text)
            assert (parsed.valid, parsed.kind, parsed.content) == (False, "invalid", text), (family, text, parsed)


@pytest.mark.parametrize("family", FAMILIES)
def test_text_tool_hands_its_action_to_the_env_as_text_and_other_calls_as_canonical_text(family):
    t = FAMILIES[family](text_tool="act")
    assert t.tools == [{"type": "function", "function": {
        "name": "act", "description": "Take one action in the environment.",
        "parameters": {"type": "object", "properties": {"action": {
            "type": "string", "description": "the action, written as the task describes"}}, "required": ["action"]}}}]
    assert t.parse(t.render("open door")).content == "open door"
    assert t.parse(t.render('{"name": "x", "arguments": {}}')).content == '{"name": "x", "arguments": {}}'
    plain = FAMILIES[family]()
    assert t.parse(plain.render(canonical("heat", {"degrees": 3}))).content == canonical("heat", {"degrees": 3})
    for args in ({"action": ""}, {"action": 3}, {"action": "x", "extra": 1}, {}):
        bad = plain.render(canonical("act", args))
        assert t.parse(bad).valid is False, args
        assert plain.parse(bad).valid is True  # without text_tool, act is a tool like any other


@pytest.mark.parametrize("family", FAMILIES)
def test_render_refuses_an_action_that_is_not_a_canonical_call(family):
    for action in ("open door", '{"name": "x"', '{"name": "x", "arguments": {}, "id": 1}', "[]"):
        with pytest.raises(ValueError, match="is not a canonical call text"):
            FAMILIES[family]().render(action)
    assert read_canonical('{"arguments": {}, "name": "x"}') == ("x", {})


@pytest.mark.parametrize("family", FAMILIES)
def test_tool_prompt_lists_each_tool_and_shows_a_call_the_template_reads(family):
    t = FAMILIES[family]()
    tools = [{"type": "function", "function": {"name": "heat", "description": "Raise it.", "parameters": {
        "type": "object", "properties": {"degrees": {"type": "integer"}}, "required": ["degrees"]}}},
        {"type": "function", "function": {"name": "finish", "description": "", "parameters": {
            "type": "object", "properties": {}}}}]
    prompt = t.tool_prompt(tools)
    for tool in tools:
        assert json.dumps(tool, ensure_ascii=False) in prompt.splitlines()
    example = prompt.split("Call one tool per reply, as:\n", 1)[1]
    assert t.parse(example).content == canonical("heat", {"degrees": "..."})


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
       args=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4), thought=st.text(max_size=30))
def test_any_call_round_trips_through_every_family(name, args, thought):
    action = canonical(name, args)
    for template in (QwenToolsTemplate(), Llama3ToolsTemplate(), HermesToolsTemplate()):
        parsed = template.parse(template.render(action, thought=thought.replace("{", "(")))
        assert parsed.valid and parsed.content == action, (type(template).__name__, action, parsed)
