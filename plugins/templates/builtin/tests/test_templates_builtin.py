"""Tests of the built-in templates: hand-written replies, render/parse round trips, total parse()."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from openmanus_rl_core.protocols import ActionTemplate, ParsedAction
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_template
from openmanus_rl_templates import AgentGymTemplate, JsonToolTemplate, ReactTemplate, hooks

TEMPLATES = {"react": ReactTemplate, "agentgym": AgentGymTemplate, "json_tool": JsonToolTemplate}
VARIANTS = {  # test id -> template (an id must be the same in every process: xdist's workers compare them)
    "react": ReactTemplate(), "react-no-think": ReactTemplate(think=False),
    "react-act-reason-unstripped": ReactTemplate(action_tag="act", think_tag="reason", strip=False),
    "agentgym": AgentGymTemplate(), "agentgym-action-on-new-line": AgentGymTemplate(action_on_new_line=True),
    "agentgym-multiline": AgentGymTemplate(multiline=True),
    "json_tool": JsonToolTemplate(), "json_tool-no-tags": JsonToolTemplate(tags=False),
    "json_tool-move-cmd-strip": JsonToolTemplate(tool_name="move", arg_name="cmd", strip=True),
}
CONFIG_DIR = Path(hooks.__file__).parent / "configs" / "template"


def ok(parsed: ParsedAction, content: str, kind: str = "action", thought: str | None = None) -> None:
    assert parsed.valid and parsed.kind == kind and parsed.content == content, parsed
    if thought is not None:
        assert parsed.thought == thought, parsed


def bad(template, text: str) -> None:
    parsed = template.parse(text)
    assert (parsed.valid, parsed.kind, parsed.content) == (False, "invalid", text), parsed


# ------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("template", list(VARIANTS.values()), ids=list(VARIANTS))
def test_conformance_kit(template):
    check_template(template)
    check_template(template, actions=["open box", "say apple", "7", "click[Buy Now]", "a {b} [c] \"d\" 'e'"])


@pytest.mark.parametrize("name", TEMPLATES)
def test_registered_config_and_short_prompt(name):
    cfg = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    assert set(cfg) == {"name", "kwargs"} and cfg["name"] == name
    template = registry("template").build(name, **cfg["kwargs"])
    assert isinstance(template, TEMPLATES[name]) and isinstance(template, ActionTemplate)
    prompt = template.system_prompt("Open the door.")
    assert prompt.startswith("Open the door.\n")
    assert len(prompt.split()) <= 30  # tiny models have tiny contexts
    assert template.system_prompt("") == prompt.split("\n", 1)[1]
    custom = TEMPLATES[name](system="Task: {instruction} Go.")
    assert custom.system_prompt("x {y}") == "Task: x {y} Go."
    assert hooks.openmanus_rl_config_dirs() == [str(CONFIG_DIR.parent)]


# ---------------------------------------------------------------------------------------- react
def test_react_cases():
    t = ReactTemplate()
    assert t.stop == ["</action>"]
    ok(t.parse("<action>open box</action>"), "open box", thought="")
    ok(t.parse("<think>need the box</think><action>open box</action>"), "open box", thought="need the box")
    ok(t.parse("<think> a\nb </think>\n\n<action>\n  say apple \n</action>\n"), "say apple", thought="a\nb")
    ok(t.parse("<think>unclosed <action>look</action>"), "look", thought="unclosed")
    ok(t.parse("plain reasoning <action>look</action>"), "look", thought="plain reasoning")
    # first complete block wins; text after </action> is ignored
    ok(t.parse("<action>a</action><action>b</action>"), "a")
    ok(t.parse("<action>a</action> trailing <action>junk"), "a")
    ok(t.parse("</action><action>late</action>"), "late")
    # the nearest opening tag before the first closing one
    ok(t.parse("I use <action> tags: <action>x</action>"), "x")
    ok(t.parse("<ACTION>Look</Action>"), "Look")
    ok(t.parse("<action>{\"a\": {\"b\": 1}}</action>"), '{"a": {"b": 1}}')
    for text in ["open box", "", "<action>open box", "open box</action>", "<action></action>",
                 "<action>  \n </action>", "<think>x</think>", "<actions>x</actions>", "<action >x</action>"]:
        bad(t, text)
    assert t.parse("<think>why</think> no action").thought == "why"


def test_react_options():
    assert ReactTemplate().render("look") == "<action>look</action>"
    assert ReactTemplate().render("look", "see") == "<think>see</think><action>look</action>"
    assert "<think>" in ReactTemplate().system_prompt("x") and "<think>" not in ReactTemplate(think=False).system_prompt("x")
    raw = ReactTemplate(strip=False)
    ok(raw.parse("<action> look </action>"), " look ")
    custom = ReactTemplate(action_tag="act", think_tag="plan")
    assert custom.stop == ["</act>"]
    ok(custom.parse("<plan>p</plan><act>go</act>"), "go", thought="p")
    bad(custom, "<action>go</action>")
    for kw in [dict(action_tag="a b"), dict(action_tag=""), dict(action_tag="x", think_tag="X"), dict(think_tag=None)]:
        with pytest.raises(ValueError):
            ReactTemplate(**kw)


# ------------------------------------------------------------------------------------- agentgym
def test_agentgym_cases():
    t = AgentGymTemplate()
    assert t.stop == ["\nObservation:"]
    ok(t.parse("Thought: I should look.\nAction: look"), "look", thought="I should look.")
    ok(t.parse("Thought:\nI should look.\n\nAction:\nlook"), "look", thought="I should look.")
    ok(t.parse("Action:\n\n   click[Buy Now]  \nObservation: you bought it"), "click[Buy Now]")
    ok(t.parse("Action: look\nAction: jump"), "look")
    ok(t.parse("Thought: take Action: x later\nAction: y"), "y", thought="take Action: x later")
    ok(t.parse("I will act. Action: look"), "look")
    ok(t.parse("  action : search[red shoes]"), "search[red shoes]")
    ok(t.parse('Action: {"a": {"b": [1, 2]}}'), '{"a": {"b": [1, 2]}}')
    for text in ["look", "", "Action:", "Action:\n\n  \n", "Thought: only thinking", "Actions: look", "reaction: x"]:
        bad(t, text)
    assert t.parse("Thought: hmm").thought == "hmm"


def test_agentgym_options():
    assert AgentGymTemplate().render("look") == "Action: look"
    assert AgentGymTemplate().render("look", "see") == "Thought: see\nAction: look"
    assert AgentGymTemplate(action_on_new_line=True).render("look") == "Action:\nlook"
    assert "Action:\nyour action" in AgentGymTemplate(action_on_new_line=True).system_prompt("x")
    multi = AgentGymTemplate(multiline=True)
    ok(multi.parse("Thought: q\nAction:\nSELECT *\nFROM t\n"), "SELECT *\nFROM t", thought="q")
    raw = AgentGymTemplate(multiline=True, strip=False)
    ok(raw.parse(raw.render("  x\n y ")), "  x\n y ")
    assert AgentGymTemplate(stop=[]).stop == []
    with pytest.raises(ValueError):
        AgentGymTemplate(stop=[""])


# ------------------------------------------------------------------------------------ json_tool
CALL = '{"name": "act", "arguments": {"action": "look"}}'


def test_json_tool_cases():
    t = JsonToolTemplate()
    assert t.stop == ["</tool_call>"]
    ok(t.parse(CALL), "look", "tool_call", thought="")
    ok(t.parse(f"<tool_call>{CALL}</tool_call>"), "look", "tool_call")
    ok(t.parse(f"I must look.\n<tool_call>\n{CALL}\n</tool_call>"), "look", "tool_call", thought="I must look.")
    ok(t.parse(f"Looking.\n```json\n{CALL}\n```"), "look", "tool_call", thought="Looking.")
    ok(t.parse(f"I use {{braces}} and {{\"x\": }} first. {CALL} then talk"), "look", "tool_call")
    ok(t.parse(f'{CALL} {{"name": "act", "arguments": {{"action": "second"}}}}'), "look", "tool_call")
    nested = {"name": "act", "arguments": {"action": "set {x: {y}}", "extra": {"deep": {"er": [1, {"z": 2}]}}}}
    ok(t.parse(json.dumps(nested)), "set {x: {y}}", "tool_call")
    ok(t.parse('{"name": "act", "arguments": "{\\"action\\": \\"look\\"}"}'), "look", "tool_call")
    ok(t.parse('{"name": "act", "parameters": {"action": "look"}}'), "look", "tool_call")
    ok(t.parse('{"name": "act", "arguments": {"action": 7}}'), "7", "tool_call")
    ok(t.parse('{"name": "act", "arguments": {"action": " look "}}'), " look ", "tool_call")
    for text in ["look", "", "{", "{}", "{" * 500, CALL[:-1], CALL.replace('"act"', '"other"'),
                 '{"name": "act"}', '{"name": "act", "arguments": {"cmd": "look"}}',
                 '{"name": "act", "arguments": {"action": null}}', '{"name": "act", "arguments": {"action": true}}',
                 '{"name": "act", "arguments": {"action": ["a"]}}', '{"name": "act", "arguments": {"action": ""}}',
                 '{"name": "act", "arguments": "not json"}', '{"name": "act", "arguments": [1]}',
                 "[" * 100_000 + "{" + "[" * 100_000, '{"a": ' * 5000 + "1" + "}" * 5000,
                 "<tool_call>{'name': 'act', 'arguments': {'action': 'look'}}</tool_call>"]:
        bad(t, text)


def test_json_tool_options():
    assert JsonToolTemplate().render("look") == f"<tool_call>{CALL}</tool_call>"
    assert JsonToolTemplate().render("look", "hm") == f"hm\n<tool_call>{CALL}</tool_call>"
    bare = JsonToolTemplate(tags=False)
    assert bare.stop == [] and bare.render("look") == CALL
    custom = JsonToolTemplate(tool_name="move", arg_name="cmd", strip=True)
    ok(custom.parse('{"name": "move", "arguments": {"cmd": "  north "}}'), "north", "tool_call")
    bad(custom, CALL)
    assert JsonToolTemplate().render("ünï 漢") == '<tool_call>{"name": "act", "arguments": {"action": "ünï 漢"}}</tool_call>'
    with pytest.raises(ValueError):
        JsonToolTemplate(tool_name="")


# ----------------------------------------------------------------------------- property tests
def _free_of(pattern: str):
    rx = re.compile(pattern, re.IGNORECASE)
    return lambda s: rx.search(s) is None


react_actions = st.text(min_size=1, max_size=80).filter(lambda a: a == a.strip() and a).filter(_free_of(r"</?action>"))
react_thoughts = st.text(max_size=80).filter(lambda s: s == s.strip()).filter(_free_of(r"</?(action|think)>"))
line_actions = st.text(min_size=1, max_size=80).filter(lambda a: a == a.strip() and a and a.splitlines() == [a])
gym_thoughts = st.text(max_size=80).filter(lambda s: s == s.strip()).filter(_free_of(r"(action|thought)[ \t]*:"))
json_actions = st.text(min_size=1, max_size=80).filter(lambda a: a.strip() != "")
json_thoughts = st.text(max_size=80).filter(lambda s: s == s.strip()).filter(_free_of(r"[{]|```|<tool_call>"))


@settings(max_examples=150, deadline=None)
@given(action=react_actions, thought=react_thoughts)
def test_react_round_trip(action, thought):
    t = ReactTemplate()
    ok(t.parse(t.render(action)), action)
    ok(t.parse(t.render(action, thought)), action, thought=thought)


@settings(max_examples=150, deadline=None)
@given(action=line_actions, thought=gym_thoughts, new_line=st.booleans())
def test_agentgym_round_trip(action, thought, new_line):
    t = AgentGymTemplate(action_on_new_line=new_line)
    ok(t.parse(t.render(action)), action)
    ok(t.parse(t.render(action, thought)), action, thought=thought)


@settings(max_examples=150, deadline=None)
@given(action=json_actions, thought=json_thoughts, tags=st.booleans())
def test_json_tool_round_trip(action, thought, tags):
    t = JsonToolTemplate(tags=tags)
    ok(t.parse(t.render(action)), action, "tool_call")
    ok(t.parse(t.render(action, thought)), action, "tool_call", thought=thought)


markup = st.sampled_from(["<action>", "</action>", "<think>", "</think>", "Action:", "Thought:", "\n", "{", "}",
                          '"name": "act"', '"arguments": {"action": "x"', "```json", "<tool_call>", "</tool_call>",
                          '{"name": "act", "arguments": {"action": "look"}}', "\x00", "\u2028", "İ", "🙂"])
any_text = st.one_of(st.text(max_size=400), st.lists(st.one_of(markup, st.text(max_size=10)), max_size=40).map("".join))


@pytest.mark.parametrize("template", list(VARIANTS.values()), ids=list(VARIANTS))
@settings(max_examples=150, deadline=None)
@given(text=any_text)
def test_parse_takes_any_text(template, text):
    parsed = template.parse(text)
    assert isinstance(parsed, ParsedAction)
    assert isinstance(parsed.content, str) and isinstance(parsed.thought, str) and isinstance(parsed.valid, bool)
    assert parsed.kind == ("invalid" if not parsed.valid else parsed.kind)
    if parsed.valid:
        assert parsed.content.strip() and parsed.kind in ("action", "tool_call")
    else:
        assert parsed.content == text


@pytest.mark.parametrize("template", list(VARIANTS.values()), ids=list(VARIANTS))
def test_parse_non_str_and_huge(template):
    for junk in [None, b"<action>look</action>", 7, "a" * 1_000_000, "{" * 200_000, "<action>" * 50_000]:
        assert isinstance(template.parse(junk), ParsedAction)
