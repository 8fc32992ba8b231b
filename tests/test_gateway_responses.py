"""``POST /v1/responses`` (openmanus_rl_core/gateway/responses.py) through the real ``openai`` SDK
(``client.responses.create`` and ``client.responses.stream``) on a real Gateway on 127.0.0.1: items in and out,
function calls, reasoning, ``previous_response_id`` within an episode, streaming as the SDK's typed events, every
call recorded as a chat call is, and the refusals naming their parameter. The engine is scripted (test_gateway.py's:
the replies are the test's input); the chat template is the Qwen2.5-style one test_gateway.py builds."""

from __future__ import annotations

import json

import openai
import pytest

from openmanus_rl_core.gateway.episodes import episode_from_record
from openmanus_rl_core.gateway.tools import ChatRenderer
from test_gateway import gateway, tok  # noqa: F401  (fixtures)

CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "ray"}}\n</tool_call>'
TOOLS = [{"type": "function", "name": "search", "description": "search the web",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
          "strict": True}]


def _client(gw, key):
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)


def test_a_string_input_with_instructions_is_one_recorded_call_rendered_as_the_chat_would_render_it(gateway, tok):
    gw = gateway(["open box"])
    key = gw.open_episode({"task_id": 1})
    out = _client(gw, key).responses.create(model="omrl-policy", instructions="Be brief.", input="hello",
                                            max_output_tokens=32, temperature=0.5)
    assert out.status == "completed" and out.output_text == "open box"
    [message] = out.output
    assert (message.type, message.role, message.content[0].type) == ("message", "assistant", "output_text")
    assert out.usage.output_tokens == len(tok.encode("open box", add_special_tokens=False)) + 1
    [call] = gw.close_episode(key).calls
    assert call.prompt_ids == gw.render([{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "hello"}], None)
    assert out.usage.input_tokens == len(call.prompt_ids) and call.text == "open box"


def test_a_function_call_comes_back_as_an_item_and_its_output_continues_the_episode_as_one_sample(gateway, tok):
    gw = gateway([CALL, "Ray is a framework."])
    key = gw.open_episode({"task_id": 0})
    client = _client(gw, key)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "what is ray?"}]}]
    first = client.responses.create(model="omrl-policy", input=items, tools=TOOLS, tool_choice="auto")
    [fc] = first.output
    assert fc.type == "function_call" and fc.name == "search" and json.loads(fc.arguments) == {"query": "ray"}
    # The SDK's way: the output items go back as input, then the tool's output.
    items += [fc.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": fc.call_id, "output": "a distributed runtime"}]
    second = client.responses.create(model="omrl-policy", input=items, tools=TOOLS)
    assert second.output_text == "Ray is a framework."
    record = gw.close_episode(key)
    prompt = tok.decode(record.calls[0].prompt_ids)
    assert '<tools>{"type": "function", "function": {"name": "search", "description": "search the web"' in prompt
    assert "<tool_response>\na distributed runtime\n</tool_response>" in tok.decode(record.calls[1].prompt_ids)
    assert episode_from_record(record).trajectory.info["gateway"] == "continuous"


def test_previous_response_id_continues_within_the_episode_and_is_400_from_another_or_unknown(gateway):
    gw = gateway([CALL, "done"])
    key, other = gw.open_episode({}), gw.open_episode({})
    client = _client(gw, key)
    first = client.responses.create(model="omrl-policy", input="what is ray?", tools=TOOLS, instructions="Be brief.")
    fc = first.output[0]
    second = client.responses.create(model="omrl-policy", previous_response_id=first.id, tools=TOOLS,
                                     instructions="Be brief.",
                                     input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "x"}])
    assert second.output_text == "done" and second.previous_response_id == first.id
    for stranger, response_id in ((_client(gw, other), first.id), (client, "resp_nothing")):
        with pytest.raises(openai.BadRequestError) as err:
            stranger.responses.create(model="omrl-policy", previous_response_id=response_id, input="again")
        assert err.value.body["param"] == "previous_response_id" and response_id in err.value.body["message"]
    unstored = client.responses.create(model="omrl-policy", input="hi", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="omrl-policy", previous_response_id=unstored.id, input="again")
    record = gw.close_episode(key)
    # The continued call's prompt is the whole conversation: the episode is one sample.
    assert len(record.calls) == 3 and episode_from_record(
        type(record)(key=key, task={}, calls=record.calls[:2])).trajectory.info["gateway"] == "continuous"


def test_a_think_block_is_a_reasoning_item_and_goes_back_into_the_prompt_as_the_model_wrote_it(gateway, tok):
    gw = gateway(["<think>the box first</think>open box", "ok"], chat=ChatRenderer(tok, reasoning_parser="think"))
    key = gw.open_episode({})
    client = _client(gw, key)
    first = client.responses.create(model="omrl-policy", input="go")
    reasoning, message = first.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "the box first"
    assert first.output_text == "open box"
    items = [{"role": "user", "content": "go"}] + [i.model_dump(exclude_none=True) for i in first.output] + [
        {"role": "user", "content": "next"}]
    client.responses.create(model="omrl-policy", input=items)
    record = gw.close_episode(key)
    assert "<|im_start|>assistant\n<think>the box first</think>open box<|im_end|>" in tok.decode(
        record.calls[1].prompt_ids)
    assert episode_from_record(record).trajectory.info["gateway"] == "continuous"


def test_a_stream_is_the_sdks_typed_events_and_its_final_response_equals_the_reply(gateway, tok):
    gw = gateway(["<think>hm</think>open box", CALL], chat=ChatRenderer(tok, reasoning_parser="think"))
    key = gw.open_episode({})
    client = _client(gw, key)
    with client.responses.stream(model="omrl-policy", input="go") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                     "response.output_item.done",
                     "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert final.output_text == "open box" and final.status == "completed"
    events = list(client.responses.create(model="omrl-policy", input="go", tools=TOOLS, stream=True))
    assert [e.type for e in events][2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                                            "response.function_call_arguments.done", "response.output_item.done"]
    assert json.loads(events[4].arguments) == {"query": "ray"} and events[-1].response.output[0].name == "search"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert len(gw.close_episode(key).calls) == 2


def test_a_reply_cut_by_its_own_max_output_tokens_is_incomplete_and_one_cut_by_the_gateways_cap_completed(gateway):
    """The Agents SDK raises on an incomplete response: a reply the agent did not cap must not end its episode."""
    gw = gateway(["open box and read the note"], script={"eos": False}, max_new_tokens=3)
    gw.batcher.engine.generate = _cut(gw.batcher.engine.generate)
    key = gw.open_episode({})
    client = _client(gw, key)
    out = client.responses.create(model="omrl-policy", input="go", max_output_tokens=2)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="omrl-policy", input="go", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"
    capped = client.responses.create(model="omrl-policy", input="go")
    assert capped.status == "completed" and capped.incomplete_details is None
    assert [len(c.completion_ids) for c in gw.close_episode(key).calls] == [2, 2, 3]


def _cut(generate):
    def cut(prompts, params):
        from openmanus_rl_core.protocols import Generation

        return [Generation(g.token_ids[:params.max_new_tokens], g.logprobs[:params.max_new_tokens], "", "length")
                for g in generate(prompts, params)]
    return cut


def test_tool_choice_parallel_tool_calls_and_text_format_reach_the_chat_request(gateway):
    from openmanus_rl_core.gateway import responses

    gw = gateway(["{}"])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    call = responses.parse({"model": "omrl-policy", "input": "go", "tools": TOOLS, "parallel_tool_calls": False,
                            "tool_choice": {"type": "function", "name": "search"},
                            "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                "strict": True}, "verbosity": "low"}}, gw, None)
    assert call.chat.tool_choice == {"type": "function", "function": {"name": "search"}}
    assert call.chat.parallel_tool_calls is False
    assert call.chat.response_format == {"type": "json_schema",
                                         "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    assert call.chat.tools == [{"type": "function", "function": {k: TOOLS[0][k] for k in
                                                                 ("name", "description", "parameters", "strict")}}]


@pytest.mark.parametrize("extra, param", [
    ({"background": True}, "background"),
    ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]"),
    ({"tool_choice": {"type": "function", "name": "lookup"}}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate")])
def test_what_the_gateway_does_not_serve_is_a_400_naming_the_parameter_and_nothing_is_recorded(gateway, extra,
                                                                                              param):
    gw = gateway(["hi"])
    key = gw.open_episode({})
    with pytest.raises(openai.BadRequestError) as err:
        _client(gw, key).responses.create(model="omrl-policy", **dict({"input": "go"}, **extra))
    assert err.value.body["param"] == param, err.value.body
    assert gw.close_episode(key).calls == []


def test_ignored_fields_are_accepted_and_logprobs_come_when_included(gateway):
    gw = gateway(["open box"])
    client = _client(gw, gw.open_episode({}))
    out = client.responses.create(model="omrl-policy", input="go", user="u", metadata={"run": "1"},
                                  truncation="auto", reasoning={"effort": "low"}, service_tier="auto",
                                  include=["message.output_text.logprobs", "reasoning.encrypted_content"])
    assert out.metadata == {"run": "1"}
    assert [lp.logprob for lp in out.output[0].content[0].logprobs] == [-0.25] * out.usage.output_tokens
    events = list(client.responses.create(model="omrl-policy", input="go", stream=True,
                                          include=["message.output_text.logprobs"]))
    [delta] = [e for e in events if e.type == "response.output_text.delta"]
    assert delta.delta == "open box" and [lp.logprob for lp in delta.logprobs] == [-0.25] * out.usage.output_tokens
