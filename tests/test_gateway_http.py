"""The gateway's HTTP stack (openmanus_rl_core/gateway/app.py): keep-alive connections survive every refusal, every
route answers in OpenAI's shapes, an unknown route lists the served ones, a request field is honoured or refused by
name, a second reward is refused, and a prompt longer than the context is OpenAI's ``context_length_exceeded``.
Real HTTP on 127.0.0.1 (``httpx`` and the ``openai`` SDK); the engine is scripted (test_gateway.py's)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from test_gateway import Script, gateway, tok  # noqa: F401  (fixtures)

OK = {"model": "omrl-policy", "messages": [{"role": "user", "content": "hello"}]}


def test_one_keep_alive_connection_survives_a_404_a_401_a_400_and_a_405_then_answers_200(gateway):
    gw = gateway(["open box"])
    key = gw.open_episode({"task_id": 0})
    with httpx.Client(base_url=gw.base_url, timeout=10) as client:
        auth = {"Authorization": f"Bearer {key}"}
        sockets = set()  # the client's own (host, port) of each request's connection

        def post(path, body, headers=auth, raw=None):
            r = client.post(path, content=raw if raw is not None else json.dumps(body), headers=headers)
            sockets.add(r.extensions["network_stream"].get_extra_info("client_addr"))
            return r

        # Each refusal comes with a body left unread by the route: the next request must still parse.
        assert post("/responses/nothing", OK).status_code == 404
        assert post("/chat/completions", OK, headers={"Authorization": "Bearer sk-wrong"}).status_code == 401
        assert post("/chat/completions", None, raw=b"{not json").status_code == 400
        r = client.request("PUT", "/chat/completions", content=json.dumps(OK), headers=auth)
        sockets.add(r.extensions["network_stream"].get_extra_info("client_addr"))
        assert r.status_code == 405 and "POST /v1/chat/completions" in r.json()["error"]["message"]
        r = post("/chat/completions", OK)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "open box"
        # ... and after a stream, on the same connection again.
        streamed = post("/chat/completions", dict(OK, stream=True))
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert post("/chat/completions", OK).status_code == 200
        assert len(sockets) == 1 and None not in sockets
    assert len(gw.close_episode(key).calls) == 3


def test_an_unknown_route_is_a_404_listing_the_served_routes_in_openais_shape(gateway):
    gw = gateway(["hi"])
    r = httpx.get(gw.base_url + "/assistants", timeout=10)
    error = r.json()["error"]
    assert r.status_code == 404 and error["type"] == "invalid_request_error"
    assert error["message"].startswith("no route GET /v1/assistants; this gateway serves GET /v1/models, ")
    for route in ("POST /v1/chat/completions", "POST /v1/responses", "POST /v1/messages", "POST /v1/rl/reward",
                  "GET /v1/models/{model_id}"):
        assert route in error["message"]


def test_models_and_one_model_by_id_answer_and_another_id_is_404(gateway):
    gw = gateway(["hi"])
    key = gw.open_episode({})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    card = client.models.retrieve("omrl-policy")
    assert (card.id, card.object, card.owned_by) == ("omrl-policy", "model", "openmanus-rl")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found"
    r = httpx.get(gw.base_url + "/models/", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["omrl-policy"]


def test_a_stream_sends_the_reply_then_its_finish_then_the_usage_when_asked_and_keeps_the_connection(gateway):
    gw = gateway(["open box"])
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.open_episode({}), max_retries=0)
    chunks = list(client.chat.completions.create(model="omrl-policy", messages=OK["messages"], stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "open box"
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens == len(gw.batcher.engine.tok.encode("open box", add_special_tokens=False)) + 1
    plain = list(client.chat.completions.create(model="omrl-policy", messages=OK["messages"], stream=True))
    assert all(c.usage is None for c in plain)


def test_a_streamed_tool_call_arrives_as_delta_tool_calls(gateway):
    gw = gateway(['<tool_call>\n{"name": "search", "arguments": {"query": "ray"}}\n</tool_call>'])
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.open_episode({}), max_retries=0)
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    chunks = list(client.chat.completions.create(model="omrl-policy", messages=OK["messages"], tools=tools,
                                                 stream=True))
    [call] = chunks[0].choices[0].delta.tool_calls
    assert (call.index, call.function.name, json.loads(call.function.arguments)) == (0, "search", {"query": "ray"})
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("field, value, param", [
    ("presence_penalty", 0.5, "presence_penalty"), ("frequency_penalty", -1, "frequency_penalty"),
    ("logit_bias", {"42": 5}, "logit_bias"), ("top_logprobs", 3, "top_logprobs"),
    ("functions", [{"name": "f"}], "functions"), ("repetition_penalty", 1.1, "repetition_penalty"),
    ("min_p", 0.1, "min_p"), ("top_k", "all", "top_k"), ("beam_width", 4, "beam_width"),
    ("tool_choice", "sometimes", "tool_choice"), ("response_format", {"type": "xml"}, "response_format"),
    ("parallel_tool_calls", "yes", "parallel_tool_calls")])
def test_a_field_the_gateway_cannot_honour_is_a_400_naming_it_and_nothing_is_recorded(gateway, field, value, param):
    gw = gateway(["hi"])
    key = gw.open_episode({})
    r = httpx.post(gw.base_url + "/chat/completions", json=dict(OK, **{field: value}),
                   headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()
    assert field in r.json()["error"]["message"]
    assert gw.close_episode(key).calls == []


def test_ignored_fields_and_no_op_values_are_accepted_and_tool_choice_reaches_the_request(gateway):
    gw = gateway(["hi"])
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.open_episode({}), max_retries=0)
    out = client.chat.completions.create(model="omrl-policy", messages=OK["messages"], seed=3, user="u",
                                         metadata={"a": "b"}, store=False, presence_penalty=0, frequency_penalty=0,
                                         logit_bias={}, top_logprobs=0, reasoning_effort="low")
    assert out.choices[0].message.content == "hi"
    from openmanus_rl_core.gateway.requests import ChatRequest

    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}}
    req = ChatRequest.parse(dict(OK, tools=tools, tool_choice={"type": "function", "function": {"name": "search"}},
                                 parallel_tool_calls=False, response_format=schema), "omrl-policy")
    assert req.tool_choice == {"type": "function", "function": {"name": "search"}}
    assert req.parallel_tool_calls is False and req.response_format == schema
    with pytest.raises(Exception, match="names the function 'lookup', which is not among the tools"):
        ChatRequest.parse(dict(OK, tools=tools, tool_choice={"type": "function", "function": {"name": "lookup"}}),
                          "omrl-policy")


def test_a_second_different_reward_is_409_naming_the_first_and_the_same_one_again_is_answered_alike(gateway):
    gw = gateway(["hi"])
    key = gw.open_episode({})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    first = client.post("/rl/reward", body={"reward": 0.5, "success": True}, cast_to=object)
    assert client.post("/rl/reward", body={"reward": 0.5, "success": True}, cast_to=object) == first
    with pytest.raises(openai.ConflictError) as err:
        client.post("/rl/reward", body={"reward": 1.0}, cast_to=object)
    assert err.value.body["message"] == ("this episode's reward is already 0.5 (success True); a second post of 1.0 "
                                         "is refused")
    record = gw.close_episode(key)
    assert (record.reward, record.success) == (0.5, True)


def test_a_prompt_at_the_context_limit_is_context_length_exceeded_and_a_reply_is_cut_where_the_context_is_full(
        gateway, tok):
    gw = gateway(["open box and read the note"], max_context_tokens=0)
    prompt = len(gw.render(OK["messages"], None))
    gw.max_context_tokens = prompt
    key = gw.open_episode({})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="omrl-policy", messages=OK["messages"])
    assert err.value.code == "context_length_exceeded" and err.value.body["param"] == "messages"
    assert err.value.body["message"] == (f"This model's maximum context length is {prompt} tokens. However, your "
                                         f"messages resulted in {prompt} tokens. Please reduce the length of the "
                                         f"messages.")
    gw.max_context_tokens = prompt + 3
    client.chat.completions.create(model="omrl-policy", messages=OK["messages"])
    [call] = gw.close_episode(key).calls
    assert len(call.prompt_ids) == prompt  # the engine was asked for at most the 3 tokens left
    assert gw.batcher.engine.params[-1].max_new_tokens == 3


def test_requests_with_different_constraints_share_one_generate_call_each_row_with_its_own(gateway):
    """Constrained decoding masks per row: a batch keeps one generate call, its constraint a list aligned with the
    prompts (a request's own constraint repeated for each of its ``n`` prompts)."""
    from openmanus_rl_core.protocols import Constraint, SamplingParams

    gw = gateway(["hi"], batch_wait_s=0.5)
    schema = Constraint(json_schema={"type": "object"}, name="answer")
    futures = [gw.batcher.submit([[1], [1]], SamplingParams(max_new_tokens=4, constraint=schema)),
               gw.batcher.submit([[2]], SamplingParams(max_new_tokens=4)),
               gw.batcher.submit([[3]], SamplingParams(max_new_tokens=4, constraint=[None]))]
    for f in futures:
        f.result(timeout=10)
    engine = gw.batcher.engine
    assert engine.batches == [4] and engine.params[0].constraint == [schema, schema, None, None]


def test_chat_called_in_process_answers_and_records_as_the_route_does(gateway):
    gw = gateway(["open box"])
    key = gw.open_episode({})
    record = gw.record(key)
    out = gw.chat(record, dict(OK, logprobs=True))
    assert out["object"] == "chat.completion" and out["choices"][0]["message"] == {"role": "assistant",
                                                                                  "content": "open box"}
    assert [t["logprob"] for t in out["choices"][0]["logprobs"]["content"]] == [-0.25] * out["usage"][
        "completion_tokens"]
    assert [c.text for c in gw.close_episode(key).calls] == ["open box"]


def test_serving_honours_the_requests_top_k_and_training_samples_as_the_run_says(gateway):
    from openmanus_rl_core.protocols import SamplingParams

    served = gateway(["hi"], keys=["k"])
    client = openai.OpenAI(base_url=served.base_url, api_key="k", max_retries=0)
    client.chat.completions.create(model="omrl-policy", messages=OK["messages"], temperature=0.5,
                                   extra_body={"top_k": 7})
    params = served.batcher.engine.params[-1]
    assert (params.temperature, params.top_k) == (0.5, 7)
    run = SamplingParams(max_new_tokens=16, temperature=1.0, top_k=0)
    trained = gateway(["hi"], sampling=run)
    client = openai.OpenAI(base_url=trained.base_url, api_key=trained.open_episode({}), max_retries=0)
    client.chat.completions.create(model="omrl-policy", messages=OK["messages"], temperature=0.5,
                                   extra_body={"top_k": 7})
    params = trained.batcher.engine.params[-1]
    assert (params.temperature, params.top_k) == (1.0, 0)
