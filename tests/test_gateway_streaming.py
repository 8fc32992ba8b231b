"""Streaming as tokens are generated (openmanus_rl_core/gateway/sse.py): the embedded default model on the real
``hf`` engine behind a real Gateway on 127.0.0.1, read with the ``openai`` and ``anthropic`` SDKs. A streamed
reply arrives in several deltas, the first before the engine has finished, and the deltas joined are the reply
exactly (greedy decoding, so the non-streamed reply is the same); an engine that cannot stream sends keep-alive
comments while it works."""

from __future__ import annotations

import json
import threading
import time

import anthropic
import httpx
import jsonschema
import openai
import pytest

from openmanus_rl_core.config.schema import ModelConfig
from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.gateway.server import Gateway
from openmanus_rl_core.models.loading import load_model_and_tokenizer
from openmanus_rl_core.protocols import SamplingParams
from told import Told

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOM = [{"role": "user", "content": "You are in a room. There is a key and a door."}]
LONG = 200  # tokens: the tiny random model rarely ends a greedy reply by itself, so a reply is this long


class Timed(HFEngine):
    """The real engine, noting when each generate call returned (to compare with when the client read a delta)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ended: list[float] = []

    def generate(self, prompts, params=None, on_tokens=None):
        try:
            return super().generate(prompts, params, on_tokens)
        finally:
            self.ended.append(time.monotonic())


class Paced(Timed):
    """The real engine, waiting after each step's tokens (up to half a second) until the client has read a delta:
    under load the engine could otherwise finish a short reply before the gateway's writer first wakes, and send it
    as one delta, which is a valid stream but not the one a test of live deltas asks for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read = threading.Event()

    def generate(self, prompts, params=None, on_tokens=None):
        if on_tokens is None:
            return super().generate(prompts, params)

        def told(*args, **kwargs):
            on_tokens(*args, **kwargs)
            self.read.wait(0.5)
            self.read.clear()
        return super().generate(prompts, params, told)


class Slow:
    """The fault a keep-alive is for: an engine that cannot stream (as a served model) and takes its time."""

    def __init__(self, engine, delay_s: float):
        self.engine, self.delay_s = engine, delay_s

    def generate(self, prompts, params):
        time.sleep(self.delay_s)
        return self.engine.generate(prompts, params)


@pytest.fixture(scope="module")
def policy():
    from tiny_hf import TEXTS

    return load_model_and_tokenizer(ModelConfig(), corpus=TEXTS)


@pytest.fixture
def serve(policy):
    model, tok = policy
    made = []

    def make(wrap=None, engine_cls=Timed, **kw):
        # No prefix cache: a later call's prefill then computes exactly as the first's, so greedy replies agree.
        engine = engine_cls(model, tok, seed=0, num_threads=1, prefix_cache_mb=0)
        gw = Gateway(wrap(engine) if wrap else engine, tok, "omrl-policy", keys=["key"], **kw)
        made.append(gw)
        return gw, engine

    yield make
    for gw in made:
        gw.close()


def _client(gw):
    return openai.OpenAI(base_url=gw.base_url, api_key="key", max_retries=0)


def test_the_engine_tells_each_steps_tokens_and_its_results_are_unchanged(policy):
    model, tok = policy
    prompts = [tok.encode(m, add_special_tokens=False) for m in ("room 1 has a box", "open door", "take key")]
    params = SamplingParams(max_new_tokens=40, temperature=1.0)
    plain = HFEngine(model, tok, seed=3, num_threads=1).generate(prompts, params)
    told = Told(len(prompts))
    streamed = HFEngine(model, tok, seed=3, num_threads=1).generate(prompts, params, on_tokens=told)
    assert [(g.token_ids, g.logprobs, g.finish_reason) for g in streamed] == \
        [(g.token_ids, g.logprobs, g.finish_reason) for g in plain]  # sampled alike, bit for bit
    assert told.tokens == [g.token_ids for g in streamed]  # each row's tokens, in order, the EOS included
    assert len(told.steps) == max(len(g.token_ids) for g in streamed)  # one call per decoding step


def test_a_streamed_chat_reply_arrives_in_deltas_before_the_engine_ends_and_joins_to_the_reply(serve):
    gw, engine = serve()
    client = _client(gw)
    whole = client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=LONG)
    assert whole.usage.completion_tokens == LONG and whole.choices[0].finish_reason == "length"
    deltas, arrived, chunks = [], [], []
    for chunk in client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=LONG,
                                                stream=True, stream_options={"include_usage": True}):
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
            arrived.append(time.monotonic())
    assert len(deltas) > 10  # token by token (a few tokens hold part of a character)
    assert arrived[0] < engine.ended[-1]  # the first delta was read while the engine still generated
    assert "".join(deltas) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices] [-1] == "length"
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == LONG
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


def test_the_sdks_stream_helper_assembles_the_same_completion(serve):
    gw, _ = serve()
    client = _client(gw)
    whole = client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=60)
    with client.chat.completions.stream(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=60) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.current_completion_snapshot  # get_final_completion refuses a reply cut by its length
    assert len(deltas) > 1 and "".join(deltas) == whole.choices[0].message.content
    assert final.choices[0].message.content == whole.choices[0].message.content
    assert final.choices[0].finish_reason == "length"


def test_a_stop_string_is_never_sent_live(serve):
    gw, _ = serve()
    client = _client(gw)
    free = client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=60)
    text = free.choices[0].message.content
    stop = text[20:24]  # four characters from the middle of the greedy reply: it ends there
    whole = client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=60,
                                           stop=[stop])
    assert whole.choices[0].finish_reason == "stop" and stop not in whole.choices[0].message.content
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="omrl-policy", messages=ROOM, temperature=0, max_tokens=60, stop=[stop], stream=True) if c.choices]
    assert "".join(deltas) == whole.choices[0].message.content and not any(stop in d for d in deltas)


def test_concurrent_streams_batched_into_one_generate_each_get_their_own_tokens(serve):
    gw, engine = serve(batch_wait_s=0.5)
    prompts = ["You are in a room. There is a key and a door.", "room 7 has a box", "open door"]
    keys = [gw.open_episode({"task_id": i}) for i in range(len(prompts))]
    joined: dict[int, str] = {}

    def ask(i):
        client = openai.OpenAI(base_url=gw.base_url, api_key=keys[i], max_retries=0)
        joined[i] = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="omrl-policy", messages=[{"role": "user", "content": prompts[i]}], temperature=0, max_tokens=50,
            stream=True) if c.choices)

    before = engine.calls
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert engine.calls - before == 1  # one batched generate call served the three streams
    for i, key in enumerate(keys):
        call = gw.close_episode(key).calls[0]
        assert joined[i] == call.text and call.text  # each stream carried its own prompt's reply
    assert len(set(joined.values())) == len(prompts)


def test_a_constrained_reply_streams_and_still_follows_its_schema(serve):
    gw, engine = serve(engine_cls=Paced)
    client = _client(gw)
    schema = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["unit", "days"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema, "strict": True}}
    whole = client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=120,
                                           response_format=fmt)
    deltas = []
    for c in client.chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=120,
                                            response_format=fmt, stream=True):
        if c.choices and c.choices[0].delta.content:
            deltas.append(c.choices[0].delta.content)
            engine.read.set()
    assert len(deltas) > 1 and "".join(deltas) == whole.choices[0].message.content
    jsonschema.validate(json.loads("".join(deltas)), schema)


def test_the_responses_api_streams_text_deltas_live(serve):
    gw, engine = serve(max_new_tokens=LONG)  # the gateway's cap, so the response is completed, not incomplete
    client = _client(gw)
    whole = client.responses.create(model="omrl-policy", input=ROOM[0]["content"], temperature=0)
    with client.responses.stream(model="omrl-policy", input=ROOM[0]["content"], temperature=0) as stream:
        kinds, deltas, arrived = [], [], []
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta" and event.delta:
                deltas.append(event.delta)
                arrived.append(time.monotonic())
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert len(deltas) > 10 and arrived[0] < engine.ended[-1]
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.usage.output_tokens == LONG and final.output[0].id.startswith("msg_")
    # the message item was announced once, before its deltas, and closed once
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 1
    assert kinds.index("response.content_part.added") < kinds.index("response.output_text.delta")


def test_the_messages_api_streams_text_deltas_live(serve):
    gw, engine = serve()
    client = anthropic.Anthropic(base_url=gw.base_url.removesuffix("/v1"), api_key="key", max_retries=0)
    greedy = {"temperature": 0}  # this SDK's methods take no temperature; the Messages API does
    whole = client.messages.create(model="omrl-policy", max_tokens=LONG, messages=ROOM, extra_body=greedy)
    with client.messages.stream(model="omrl-policy", max_tokens=LONG, messages=ROOM, extra_body=greedy) as stream:
        deltas, arrived = [], []
        for text in stream.text_stream:
            deltas.append(text)
            arrived.append(time.monotonic())
        final = stream.get_final_message()
    assert len(deltas) > 10 and arrived[0] < engine.ended[-1]
    assert "".join(deltas) == final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == LONG


def test_an_engine_that_cannot_stream_sends_keep_alives_then_the_reply(serve):
    gw, _ = serve(wrap=lambda engine: Slow(engine, 0.6))
    gw.keepalive_s = 0.1
    body = {"model": "omrl-policy", "messages": ROOM, "temperature": 0, "max_tokens": 20, "stream": True}
    with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=30,
                      headers={"Authorization": "Bearer key"}) as r:
        lines = [line for line in r.iter_lines() if line]
    first = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert first >= 3 and set(lines[:first]) == {": keep-alive"}  # comments while the engine worked
    assert lines[-1] == "data: [DONE]"
    content = [json.loads(line[5:])["choices"][0]["delta"].get("content") for line in lines[first:-1]]
    # as the finished reply's stream was before: the whole content in one delta, then the finish
    whole = _client(gw).chat.completions.create(model="omrl-policy", messages=ROOM, temperature=0, max_tokens=20)
    assert content == [whole.choices[0].message.content, None]
    # the SDK reads the comments as nothing
    assert "".join(c.choices[0].delta.content or "" for c in _client(gw).chat.completions.create(
        model="omrl-policy", messages=ROOM, temperature=0, max_tokens=20, stream=True)) == content[0]


def _live(parser, text, tok, hold_all=False, stops=()):
    """What goes out live as ``text`` is generated token by token (the rule of gateway/sse.py)."""
    from openmanus_rl_core.gateway.reasoning import reasoning_parser_for
    from openmanus_rl_core.gateway.sse import LiveText
    from openmanus_rl_core.gateway.tools import reply_text

    live = LiveText(reasoning_parser_for(parser), hold_all, list(stops))
    ids, out = tok.encode(text, add_special_tokens=False), []
    for n in range(1, len(ids) + 1):
        out += live.advance(reply_text(tok, ids[:n]))
    return out, live


def test_a_think_block_goes_out_whole_when_it_closes_then_the_answer_live(policy):
    from openmanus_rl_core.gateway.reasoning import reasoning_parser_for

    tok = policy[1]
    text = "<think>\nthe door is open\n</think>\n\nYou win. The door is open."
    out, live = _live("think", text, tok)
    reasoning, content = reasoning_parser_for("think").split(text)
    assert out[0] == ("reasoning", reasoning) and [k for k, _ in out[1:]] == ["content"] * (len(out) - 1)
    assert len(out) > 3 and "".join(d for _, d in out[1:]) + live.rest(content) == content
    assert _live("think", "the door is open and", tok)[0] == []  # may yet close a block the prompt opened


def test_nothing_goes_out_live_where_a_parser_must_see_the_whole_reply(policy, serve):
    tok = policy[1]
    assert _live("none", "<tool_call> take key", tok, hold_all=True)[0] == []
    assert _live("harmony", "<|channel|>analysis", tok)[0] == []
    out, live = _live("none", "open the door</action> now", tok, stops=["</action>"])
    assert "".join(d for _, d in out) == "open the door"  # never the stop string, nor its first characters
    gw, _ = serve()
    tools = [{"type": "function", "function": {"name": "take", "parameters": {"type": "object", "properties": {}}}}]
    chunks = [c for c in _client(gw).chat.completions.create(
        model="omrl-policy", messages=ROOM, temperature=0, max_tokens=40, tools=tools, stream=True) if c.choices]
    assert [bool(c.choices[0].delta.content) for c in chunks] == [True, False]  # the reply whole, at the end


def test_a_character_split_across_tokens_is_sent_only_whole(policy):
    tok = policy[1]
    text = "naïve café – 北京 ok"
    out, live = _live("none", text, tok)
    assert len(tok.encode(text, add_special_tokens=False)) > len(text)  # some characters take several tokens
    assert not any("\ufffd" in d for _, d in out) and "".join(d for _, d in out) + live.rest(text) == text


class Broken:
    """The fault: an engine that fails while a streamed request waits for it."""

    def generate(self, prompts, params):
        raise RuntimeError("the accelerator fell over")


def test_an_engine_failure_ends_the_stream_on_an_error_the_sdk_raises(serve):
    gw, _ = serve(wrap=lambda engine: Broken())
    with pytest.raises(openai.APIError, match="the accelerator fell over"):
        list(_client(gw).chat.completions.create(model="omrl-policy", messages=ROOM, max_tokens=5, stream=True))
    events = list(_client(gw).responses.create(model="omrl-policy", input="go", stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].response.error.message == "RuntimeError: the accelerator fell over"
    client = anthropic.Anthropic(base_url=gw.base_url.removesuffix("/v1"), api_key="key", max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="the accelerator fell over"):
        with client.messages.stream(model="omrl-policy", max_tokens=5, messages=ROOM) as stream:
            list(stream)


def test_each_choice_of_n_streams_its_own_reply(serve):
    gw, _ = serve()
    key = gw.open_episode({"task_id": 0})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    joined = {0: "", 1: ""}
    for chunk in client.chat.completions.create(model="omrl-policy", messages=ROOM, max_tokens=30, n=2,
                                                temperature=1.0, stream=True):
        for choice in chunk.choices:
            joined[choice.index] += choice.delta.content or ""
    calls = gw.close_episode(key).calls
    assert [joined[0], joined[1]] == [c.text for c in calls] and calls[0].text != calls[1].text


@pytest.fixture(scope="module")
def thinker():
    """A tiny model taught to open each reply with a ``<think>`` block, its template Qwen3's way
    (tests/thinking_model.py), behind a Gateway whose reasoning parser is therefore ``think``; and its prompt."""
    import thinking_model
    from openmanus_rl_core.plugin.registry import build

    model, tok = thinking_model.build()
    gw = Gateway(HFEngine(model, tok, seed=0, num_threads=1, prefix_cache_mb=0), tok, "omrl-policy", keys=["key"])
    env, template = thinking_model.relay_env(), build("template", {"name": "react", "kwargs": {"think": True}})
    first = env.reset(task_id=0)
    yield gw, [{"role": "system", "content": template.system_prompt(env.instruction)},
               {"role": "user", "content": first}]
    gw.close()


def test_a_reasoning_reply_streams_its_reasoning_once_then_its_answer_in_every_api(thinker):
    from thinking_model import THOUGHT

    gw, messages = thinker
    assert gw.renderer.reasoning_parser.name == "think"
    client = _client(gw)
    whole = client.chat.completions.create(model="omrl-policy", messages=messages, temperature=0, max_tokens=60)
    answer, thought = whole.choices[0].message.content, whole.choices[0].message.reasoning_content
    assert thought == THOUGHT and answer.startswith("<action>say ")
    deltas = [c.choices[0].delta for c in client.chat.completions.create(
        model="omrl-policy", messages=messages, temperature=0, max_tokens=60, stream=True) if c.choices]
    assert deltas[0].role == "assistant" and deltas[0].reasoning_content == thought  # whole, first
    assert not any(getattr(d, "reasoning_content", None) for d in deltas[1:])
    assert "".join(d.content or "" for d in deltas) == answer
    with client.responses.stream(model="omrl-policy", input=messages[1:], instructions=messages[0]["content"],
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, i.id) for i in added] == [(o.type, o.id) for o in final.output]  # announced once, in order
    assert final.output[0].content[0].text == thought and final.output_text == answer
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == answer
    client = anthropic.Anthropic(base_url=gw.base_url.removesuffix("/v1"), api_key="key", max_retries=0)
    with client.messages.stream(model="omrl-policy", max_tokens=60, system=messages[0]["content"],
                                messages=messages[1:], extra_body={"temperature": 0}) as stream:
        starts = [e.content_block.type for e in stream if e.type == "content_block_start"]
        message = stream.get_final_message()
    assert starts == ["thinking", "text"] and message.content[0].thinking == thought
    assert message.content[1].text == answer
