"""``POST /v1/messages`` (openmanus_rl_core/gateway/messages.py) through the real ``anthropic`` SDK on a real
Gateway on 127.0.0.1: the key in ``x-api-key``, ``system``, text / ``tool_use`` / ``tool_result`` blocks, tools,
``tool_choice``, stop sequences, streaming as Anthropic's events, refusals in Anthropic's error shape, and every call
recorded as a chat call is. The engine is scripted (test_gateway.py's)."""

from __future__ import annotations

import anthropic
import pytest

from openmanus_rl_core.gateway.episodes import episode_from_record
from test_gateway import gateway, tok  # noqa: F401  (fixtures)

CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "ray"}}\n</tool_call>'
TOOLS = [{"name": "search", "description": "search the web",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}]


def _client(gw, key):
    return anthropic.Anthropic(base_url=gw.base_url.removesuffix("/v1"), api_key=key, max_retries=0)


def test_a_message_with_system_and_a_stop_sequence_is_one_recorded_call(gateway):
    gw = gateway(["<action>open box</action>"])
    key = gw.open_episode({})
    out = _client(gw, key).messages.create(model="omrl-policy", max_tokens=256, system="Be brief.",
                                           messages=[{"role": "user", "content": "hello"}],
                                           stop_sequences=["</action>"])
    assert [b.type for b in out.content] == ["text"] and out.content[0].text == "<action>open box"
    assert (out.stop_reason, out.stop_sequence) == ("stop_sequence", "</action>")
    [call] = gw.close_episode(key).calls
    assert call.prompt_ids == gw.render([{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "hello"}], None)
    assert (out.usage.input_tokens, out.usage.output_tokens) == (len(call.prompt_ids), len(call.completion_ids))


def test_tool_use_then_tool_result_blocks_continue_the_episode_as_one_sample(gateway, tok):
    gw = gateway([CALL, "Ray is a framework."])
    key = gw.open_episode({})
    client = _client(gw, key)
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is ray?"}]}]
    first = client.messages.create(model="omrl-policy", max_tokens=256, messages=messages, tools=TOOLS,
                                   tool_choice={"type": "auto"})
    [use] = first.content
    assert first.stop_reason == "tool_use" and (use.type, use.name, use.input) == ("tool_use", "search",
                                                                                   {"query": "ray"})
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "a distributed runtime"}]}]
    second = client.messages.create(model="omrl-policy", max_tokens=256, messages=messages, tools=TOOLS)
    assert second.content[0].text == "Ray is a framework." and second.stop_reason == "end_turn"
    record = gw.close_episode(key)
    assert "<tool_response>\na distributed runtime\n</tool_response>" in tok.decode(record.calls[1].prompt_ids)
    assert episode_from_record(record).trajectory.info["gateway"] == "continuous"


def test_a_stream_is_anthropics_events_and_the_sdk_assembles_the_message(gateway):
    gw = gateway(["open box", CALL])
    client = _client(gw, gw.open_episode({}))
    with client.messages.stream(model="omrl-policy", max_tokens=256,
                                messages=[{"role": "user", "content": "go"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert final.content[0].text == "open box" and final.stop_reason == "end_turn"
    with client.messages.stream(model="omrl-policy", max_tokens=256, tools=TOOLS,
                                messages=[{"role": "user", "content": "go"}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].input == {"query": "ray"} and final.stop_reason == "tool_use"


def test_tool_choice_any_and_a_named_tool_reach_the_chat_request():
    from openmanus_rl_core.gateway import messages

    body = {"model": "omrl-policy", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    call = messages.parse(dict(body, tool_choice={"type": "any", "disable_parallel_tool_use": True}), "omrl-policy")
    assert (call.chat.tool_choice, call.chat.parallel_tool_calls) == ("required", False)
    call = messages.parse(dict(body, tool_choice={"type": "tool", "name": "search"}), "omrl-policy")
    assert call.chat.tool_choice == {"type": "function", "function": {"name": "search"}}
    assert call.chat.tools[0]["function"]["parameters"] == TOOLS[0]["input_schema"]


def test_a_wrong_key_is_anthropics_authentication_error_and_a_bearer_key_works_too(gateway):
    gw = gateway(["hi"])
    with pytest.raises(anthropic.AuthenticationError) as err:
        _client(gw, "sk-wrong").messages.create(model="omrl-policy", max_tokens=8,
                                                messages=[{"role": "user", "content": "go"}])
    assert err.value.body == {"type": "error", "error": {
        "type": "authentication_error",
        "message": "Incorrect API key provided. Each episode's key is in its OPENAI_API_KEY."}}
    key = gw.open_episode({})
    bearer = anthropic.Anthropic(base_url=gw.base_url.removesuffix("/v1"), auth_token=key, max_retries=0)
    assert bearer.messages.create(model="omrl-policy", max_tokens=8,
                                  messages=[{"role": "user", "content": "go"}]).content[0].text == "hi"


@pytest.mark.parametrize("extra, where", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]},
     "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tool_choice": {"type": "tool", "name": "lookup"}, "tools": TOOLS}, "tool_choice")])
def test_what_is_not_served_is_a_400_in_anthropics_shape_naming_it(gateway, extra, where):
    gw = gateway(["hi"])
    key = gw.open_episode({})
    body = dict({"model": "omrl-policy", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}]}, **extra)
    with pytest.raises(anthropic.BadRequestError) as err:
        _client(gw, key).messages.create(**body)
    assert err.value.body["error"]["type"] == "invalid_request_error" and where in err.value.body["error"]["message"]
    assert gw.close_episode(key).calls == []


def test_count_tokens_is_the_rendered_prompts_length_and_records_nothing(gateway):
    gw = gateway(["hi"])
    key = gw.open_episode({})
    messages = [{"role": "user", "content": "what is ray?"}]
    counted = _client(gw, key).messages.count_tokens(model="omrl-policy", system="Be brief.", messages=messages,
                                                     tools=TOOLS)
    chat_tools = [{"type": "function", "function": {"name": "search", "description": "search the web",
                                                    "parameters": TOOLS[0]["input_schema"]}}]
    assert counted.input_tokens == len(gw.render([{"role": "system", "content": "Be brief."}] + messages, chat_tools))
    assert gw.close_episode(key).calls == []
