"""Tool-call and reasoning parsers per model family (openmanus_rl_core/gateway/parsers.py), each on the text its
family's REAL chat template renders (tests/templates/, sources in its README): an assistant message with tool calls
rendered by the template is parsed back to the same calls; the parser's own ``write`` gives the template's text; the
family is found from the template itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openmanus_rl_core.gateway.parsers import TOOL_PARSERS, tool_parser_for
from openmanus_rl_core.gateway.tools import reply_text
from openmanus_rl_core.gateway.reasoning import REASONING_PARSERS, reasoning_parser_for

TEMPLATES = Path(__file__).parent / "templates"

TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "the words"},
                                                    "k": {"type": "integer", "description": "how many"}},
                   "required": ["query"]}}}]
ARGS = {"query": 'ray "actors" — docs', "k": 3}


@pytest.fixture(scope="module")
def tok():
    from openmanus_rl_core.models.loading import build_tokenizer
    from tiny_hf import TEXTS

    return build_tokenizer(TEXTS, vocab_size=300)


def _render(tok, template: str, messages: list[dict], gen: bool) -> str:
    """The template's text, through transformers' own renderer (what ``apply_chat_template`` calls; called
    directly so that a None content reaches the template as None, which R1's template needs to write calls)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    [text], _ = render_jinja_template(conversations=[messages], tools=TOOLS, chat_template=template,
                                      add_generation_prompt=gen, bos_token="<s>", eos_token="</s>")
    return text


def _assistant_text(tok, file: str, reply: dict, header: str, end: str) -> str:
    """What the template writes for ``reply`` after the user's turn: the conversation with it, less the one
    without it, less the assistant header ``header`` and the end-of-turn text ``end``."""
    template = (TEMPLATES / file).read_text()
    head = [{"role": "user", "content": "what is ray?"}]
    before = _render(tok, template, head, gen=False)
    after = _render(tok, template, head + [reply], gen=False)
    assert after.startswith(before), file
    text = after[len(before):]
    assert text.startswith(header) and text.endswith(end), repr(text)
    return text[len(header):len(text) - len(end)]


def _call(args, as_string=False, call_id="abc123XYZ"):
    return {"id": call_id, "type": "function",
            "function": {"name": "search", "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


# (template file, parser, the assistant's header and end-of-turn text, arguments as a JSON string)
FAMILIES = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes", "<|im_start|>assistant\n", "<|im_end|>\n", False),
    ("Qwen-Qwen3-0.6B.jinja", "hermes", "<|im_start|>assistant\n", "<|im_end|>\n", False),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "hermes", "<|im_start|>assistant\n", "<|im_end|>\n",
     False),
    ("Qwen3-Coder.jinja", "qwen3_coder", "<|im_start|>assistant\n", "<|im_end|>\n", False),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json",
     "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", False),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", "", "</s>", False),
    ("unsloth-mistral-Devstral-Small-2507.jinja", "mistral_args", "", "</s>", False),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral_args", "", "</s>", False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_v3", "<｜Assistant｜>", "", True),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek_v31", "<｜Assistant｜></think>", "<｜end▁of▁sentence｜>", True),
    ("openai-gpt-oss-120b.jinja", "harmony", "<|start|>assistant", "", False),
]


@pytest.mark.parametrize("file,name,header,end,as_string", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_family_reads_back_the_calls_its_real_template_renders(tok, file, name, header, end, as_string):
    # R1's template writes the calls of a message whose content is None only; Qwen3's needs a string
    reply = {"role": "assistant", "content": None if "R1" in file else "", "tool_calls": [_call(ARGS, as_string)]}
    text = _assistant_text(tok, file, reply, header, end)
    parser = tool_parser_for(name)
    thought, rest = reasoning_parser_for(None, _with_template(tok, file)).split(text)
    content, calls = parser.parse(rest, TOOLS)
    assert content == "" and thought in (None, "")  # Qwen3 writes an empty think block before the last reply
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("search", ARGS)]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    # the family as the template names it; and the parser writes what the template writes
    assert tool_parser_for(None, _with_template(tok, file)).name == name
    if name == "mistral":  # Nemo's template adds the call's id to the list
        assert text == parser.write_calls([("search", ARGS)])[:-2] + ', "id": "abc123XYZ"}]'
    elif "Small-3.2" in file:  # and 3.2's its [CALL_ID]
        assert text == parser.write_calls([("search", ARGS)]).replace("[ARGS]", "[CALL_ID]abc123XYZ[ARGS]")
    elif name == "deepseek_v3":  # R1's template leaves out the end of the list after a lone call
        assert text + "<｜tool▁calls▁end｜>" == parser.write_calls([("search", ARGS)])
    elif "Qwen3" in file and name == "hermes":
        assert rest == parser.write_calls([("search", ARGS)])
    else:
        assert text == parser.write_calls([("search", ARGS)])


def _with_template(tok, file):
    class Tok:
        chat_template = (TEMPLATES / file).read_text()
    return Tok()


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_write_and_parse_agree_for_two_calls_and_the_wrapper_frames_the_arguments(name):
    parser = tool_parser_for(name)
    calls = [("search", ARGS), ("open", {"url": "https://ray.io", "tabs": [1, 2], "new": True})]
    text = parser.write_calls(calls) if name != "harmony" else "<|start|>assistant".join(
        parser.write(n, a) for n, a in calls)
    content, parsed = parser.parse("I will look. " * (name in ("hermes", "qwen3_coder")) + text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    assert content == ("I will look." if name in ("hermes", "qwen3_coder") else "")
    prefix, suffix = parser.wrapper("search")
    one = parser.write("search", ARGS)
    assert one.startswith(prefix) and one.endswith(suffix)
    if parser.arguments_json:
        assert json.loads(one[len(prefix):len(one) - len(suffix)]) == ARGS


@pytest.mark.parametrize("name", [n for n in sorted(TOOL_PARSERS) if TOOL_PARSERS[n].call_format])
def test_calls_a_grammar_writes_from_the_call_format_are_read_back(name):
    """What a grammar built from ``call_format`` makes the model write: the opening, each call's JSON object between
    its prefix and suffix, the separator between them, the closing."""
    parser = tool_parser_for(name)
    f = parser.call_format
    calls = [("search", ARGS), ("open", {"url": "https://ray.io"})]
    text = f["opening"] + f["separator"].join(
        f["prefix"] + json.dumps({"name": n, f["arguments_key"]: a}) + f["suffix"] for n, a in calls) + f["closing"]
    content, parsed = parser.parse(text)
    assert content == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    one = f["opening"] + f["prefix"] + json.dumps({"name": "search", f["arguments_key"]: ARGS}, ensure_ascii=False) \
        + f["suffix"] + f["closing"]
    assert one == parser.write_calls([("search", ARGS)])  # the very text the family's template writes


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_a_reply_that_is_not_a_call_stays_content(name):
    parser = tool_parser_for(name)
    for text in ("Ray is a framework.", "<tool_call>\nnot json\n</tool_call>", "{\"no\": \"name\"}"):
        content, calls = parser.parse(text)
        assert calls == [] and content == text.strip()


def test_qwen3_coder_values_take_their_schemas_type_or_read_as_json():
    parser = tool_parser_for("qwen3_coder")
    text = parser.write("search", {"query": "42", "k": 7})
    assert json.loads(parser.parse(text, TOOLS)[1][0]["function"]["arguments"]) == {"query": "42", "k": 7}
    # without the tools, a value that reads as JSON is JSON; text stays text
    text = parser.write("f", {"a": "hello world", "b": 2.5, "c": [1], "d": True})
    assert json.loads(parser.parse(text)[1][0]["function"]["arguments"]) == {"a": "hello world", "b": 2.5,
                                                                           "c": [1], "d": True}


def test_llama_calls_after_the_python_tag_and_separated_by_semicolons():
    parser = tool_parser_for("llama3_json")
    content, calls = parser.parse('Let me check.<|python_tag|>{"name": "a", "parameters": {"x": 1}}; '
                                  '{"name": "b", "arguments": {}}<|eom_id|>')
    assert content == "Let me check." and [c["function"]["name"] for c in calls] == ["a", "b"]


def test_qwen3s_thinking_is_split_out_of_the_reply_its_template_renders(tok):
    text = _assistant_text(tok, "Qwen-Qwen3-0.6B.jinja",
                           {"role": "assistant", "content": "It is a runtime.", "reasoning_content": "Recall ray."},
                           "<|im_start|>assistant\n", "<|im_end|>\n")
    assert text.startswith("<think>")
    parser = reasoning_parser_for(None, _with_template(tok, "Qwen-Qwen3-0.6B.jinja"))
    assert parser.name == "think" and parser.split(text) == ("Recall ray.", "It is a runtime.")
    # a call after the thinking: split, then parsed
    text = _assistant_text(tok, "Qwen-Qwen3-0.6B.jinja",
                           {"role": "assistant", "content": "", "reasoning_content": "Search it.",
                            "tool_calls": [_call(ARGS)]}, "<|im_start|>assistant\n", "<|im_end|>\n")
    thought, rest = parser.split(text)
    content, calls = tool_parser_for(None, _with_template(tok, "Qwen-Qwen3-0.6B.jinja")).parse(rest)
    assert thought == "Search it." and content == "" and json.loads(calls[0]["function"]["arguments"]) == ARGS


def test_a_reply_that_began_inside_the_think_block_or_was_cut_in_it():
    think = reasoning_parser_for("think")
    assert think.split("the prompt opened it\n</think>\n\nAnswer.") == ("the prompt opened it", "Answer.")
    assert think.split("<think>\nstill going") == ("still going", "")
    assert think.split("No thinking here.") == (None, "No thinking here.")
    assert reasoning_parser_for("none").split("<think>x</think>y") == (None, "<think>x</think>y")


def test_gpt_oss_analysis_is_reasoning_and_its_call_is_a_call(tok):
    text = _assistant_text(tok, "openai-gpt-oss-120b.jinja",
                           {"role": "assistant", "thinking": "Look it up.", "tool_calls": [_call(ARGS)]},
                           "<|start|>assistant", "")
    reasoning = reasoning_parser_for(None, _with_template(tok, "openai-gpt-oss-120b.jinja"))
    thought, rest = reasoning.split(text)
    content, calls = tool_parser_for("harmony").parse(rest)
    assert reasoning.name == "harmony" and thought == "Look it up." and content == ""
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS
    assert reasoning.split("<|channel|>final<|message|>Done.") == (None, "<|channel|>final<|message|>Done.")
    assert tool_parser_for("harmony").parse("<|channel|>final<|message|>Done.") == ("Done.", [])


def test_the_embedded_default_and_unknown_templates_use_hermes_and_no_reasoning(tok):
    assert tool_parser_for(None, tok).name == "hermes" and reasoning_parser_for(None, tok).name == "none"


def test_an_unknown_parser_name_is_one_line_naming_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"^agent\.tool_parser='hermse' is not a known tool parser; the known ones "
                                         r"are hermes, .*; did you mean hermes\?$"):
        tool_parser_for("hermse")
    with pytest.raises(ValueError, match=r"^agent\.reasoning_parser='thinking' is not a known reasoning parser"):
        reasoning_parser_for("thinking")


def test_the_configs_choices_are_the_registered_parsers():
    import dataclasses

    from openmanus_rl_core.config.schema import AgentConfig

    meta = {f.name: f.metadata for f in dataclasses.fields(AgentConfig)}
    assert tuple(meta["tool_parser"]["choices"]) == tuple(TOOL_PARSERS)
    assert tuple(meta["reasoning_parser"]["choices"]) == tuple(REASONING_PARSERS)
    assert AgentConfig().tool_parser is None and AgentConfig().reasoning_parser is None


def test_reply_text_keeps_special_tokens_and_drops_the_closing_eos(tok):
    ids = tok.encode("<|im_start|>hi", add_special_tokens=False) + [tok.eos_token_id]
    assert reply_text(tok, ids) == "<|im_start|>hi"
