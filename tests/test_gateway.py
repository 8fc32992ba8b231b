"""The gateway (openmanus_rl_core/gateway): an OpenAI client talks to the policy; every call is recorded, token for
token. Real HTTP on 127.0.0.1, the real ``openai`` SDK, a Qwen2-family byte-level BPE with a tool-aware ChatML
template built here; the engine is scripted (the replies are the test's input, not what is tested)."""

from __future__ import annotations

import json
import socket
import urllib.request

import openai
import pytest

from openmanus_rl_core.gateway.episodes import episode_from_record
from openmanus_rl_core.gateway.server import Gateway
from openmanus_rl_core.protocols import Generation

# Qwen2.5's layout: tools in the system turn, calls in <tool_call> blocks, tool results as <tool_response> user turns.
TOOLS_CHATML = (
    "{% if tools %}<|im_start|>system\n"
    "{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}\n\n# Tools\n\n"
    "<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each call, return "
    "<tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    from openmanus_rl_core.models.loading import build_tokenizer
    from tiny_hf import TEXTS

    tokenizer = build_tokenizer(TEXTS + ["The box is open. The note says: apple.", "say apple", "open box"],
                                vocab_size=400)
    tokenizer.chat_template = TOOLS_CHATML
    return tokenizer


class Script:
    """An engine that answers the n-th prompt it is given with ``replies[n]`` (its token ids, the EOS added when
    ``eos``), cut at ``params.max_new_tokens`` (finish ``length``), log-prob -0.25 per token."""

    def __init__(self, tok, replies, eos=True):
        self.tok, self.replies, self.eos = tok, list(replies), eos
        self.prompts: list[list[int]] = []
        self.batches: list[int] = []  # the number of prompts of each generate call
        self.params: list = []  # the sampling settings of each generate call
        self.generator = None

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        self.params.append(params)
        out = []
        for p in prompts:
            text = self.replies[len(self.prompts) % len(self.replies)]
            self.prompts.append(list(p))
            ids = self.tok.encode(text, add_special_tokens=False) + ([self.tok.eos_token_id] if self.eos else [])
            kept = ids[:params.max_new_tokens]  # as an engine cuts a reply at its budget
            if len(kept) < len(ids):
                text = self.tok.decode(kept, skip_special_tokens=True)
            out.append(Generation(kept, [-0.25] * len(kept), text, "stop" if len(kept) == len(ids) else "length"))
        return out

    def update_weights(self, sd):
        pass


@pytest.fixture
def gateway(tok):
    made = []

    def make(replies, **kw):
        gw = Gateway(Script(tok, replies, **kw.pop("script", {})), tok, "omrl-policy", **kw)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.close()


def _post(url, key, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {key}",
                                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_wrong_key_is_401_an_unknown_model_404_and_a_malformed_request_400_in_openais_shape(gateway):
    gw = gateway(["hi"])
    key = gw.open_episode({"task_id": 0})
    url = gw.base_url + "/chat/completions"
    ok = {"model": "omrl-policy", "messages": [{"role": "user", "content": "hello"}]}
    assert _post(url, "sk-wrong", ok) == (401, {"error": {
        "message": "Incorrect API key provided. Each episode's key is in its OPENAI_API_KEY.",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}})
    status, body = _post(url, key, dict(ok, model="gpt-4o"))
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    for bad, param, message in (
            ({"model": "omrl-policy", "messages": []}, "messages", "messages must be a non-empty list"),
            (dict(ok, n=0), "n", "n=0 is out of range [1, 64]"),
            (dict(ok, temperature="hot"), "temperature", "temperature must be a number, got 'hot'"),
            (dict(ok, messages=[{"role": "robot", "content": "x"}]), "messages[0]", None)):
        status, body = _post(url, key, bad)
        assert status == 400 and body["error"]["type"] == "invalid_request_error", body
        assert body["error"]["param"] == param and (message is None or body["error"]["message"] == message)
    status, body = _post(url, key, None, raw=b"{not json")
    assert status == 400 and body["error"]["message"].startswith("the request body is not JSON")
    assert gw.close_episode(key).calls == []  # nothing refused was recorded


def test_the_listener_is_loopback_only(gateway):
    gw = gateway(["hi"])
    host, port = gw.address
    assert host == "127.0.0.1"
    outside = [a for a in socket.gethostbyname_ex(socket.gethostname())[2] if not a.startswith("127.")]
    for address in outside:  # the machine's other addresses reach nothing
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()


def test_the_sdk_gets_replies_models_logprobs_a_stream_and_posts_the_reward(gateway):
    gw = gateway(["<action>open box</action>"])
    key = gw.open_episode({"task_id": 7, "seed": 1, "group_id": "g"})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["omrl-policy"]
    msgs = [{"role": "user", "content": "hello"}]
    out = client.chat.completions.create(model="omrl-policy", messages=msgs, logprobs=True, stop=["</action>"])
    assert out.choices[0].message.content == "<action>open box"  # OpenAI's way: the stop string is left out
    assert [t.logprob for t in out.choices[0].logprobs.content] == [-0.25] * out.usage.completion_tokens
    kept = client.chat.completions.create(model="omrl-policy", messages=msgs, stop=["</action>"],
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content == "<action>open box</action>"
    chunks = list(client.chat.completions.create(model="omrl-policy", messages=msgs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "<action>open box</action>"
    two = client.chat.completions.create(model="omrl-policy", messages=msgs, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    client.post("/rl/reward", body={"reward": 0.75, "success": True}, cast_to=object)
    record = gw.close_episode(key)
    assert record.reward == 0.75 and record.success is True and len(record.calls) == 5
    with pytest.raises(openai.AuthenticationError):  # a closed episode's key is refused
        client.models.list()


def test_a_batch_closes_once_every_running_agent_has_asked_and_waits_a_gap_for_one_that_has_not(gateway):
    """Agents' requests go to the engine together: at once when every running agent has asked (the gap, 5 s here,
    is not waited), after a gap with nothing new when a running agent is elsewhere (in its env)."""
    import threading
    import time

    gw = gateway(["open box"], batch_wait_s=5.0)
    keys = [gw.open_episode({"task_id": i}) for i in range(3)]

    def ask(keys):
        # The clients are built first and the requests leave together (a barrier): building a client can take longer
        # than the gap on a loaded machine, and a request that left late would rightly close a batch of its own.
        clients = [openai.OpenAI(base_url=gw.base_url, api_key=k, max_retries=0) for k in keys]
        start = threading.Barrier(len(keys) + 1)

        def post(client):
            start.wait()
            client.chat.completions.create(model="omrl-policy", messages=[{"role": "user", "content": "hi"}])

        threads = [threading.Thread(target=post, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.monotonic()
        for t in threads:
            t.join()
        return time.monotonic() - t0

    for k in keys:
        gw.agent_running(k, True)
    assert ask(keys) < 3.0 and gw.batcher.engine.batches == [3]
    gw.agent_running(keys[2], False)  # an agent that ended is not waited for
    assert ask(keys[:2]) < 3.0 and gw.batcher.engine.batches == [3, 2]
    gw.batcher.wait_s = 1.0
    gw.agent_running(keys[2], True)  # running, but not asking: the batch closes after a gap of 1 s
    assert ask(keys[:2]) >= 1.0 and gw.batcher.engine.batches == [3, 2, 2]


def test_a_tool_call_comes_back_in_openais_shape_and_renders_back_into_the_next_prompt(gateway, tok):
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "ray"}}\n</tool_call>'
    gw = gateway([call, "Ray is a framework."])
    key = gw.open_episode({"task_id": 0})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    tools = [{"type": "function", "function": {"name": "search", "description": "search the web",
                                               "parameters": {"type": "object",
                                                              "properties": {"query": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "what is ray?"}]
    first = client.chat.completions.create(model="omrl-policy", messages=msgs, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [tc] = choice.message.tool_calls
    assert tc.function.name == "search" and json.loads(tc.function.arguments) == {"query": "ray"}
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": tc.id, "content": "a distributed runtime"}]
    client.chat.completions.create(model="omrl-policy", messages=msgs, tools=tools)
    record = gw.close_episode(key)
    prompt = tok.decode(record.calls[0].prompt_ids)
    assert '<tools>{"type": "function", "function": {"name": "search", "description": "search the web"' in prompt
    # The call re-rendered as the template writes it: the model's own tokens, so the episode stays one sample.
    assert episode_from_record(record).trajectory.info["gateway"] == "continuous"


def _agent_loop_episode(tok, replies):
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.rollout import AgentLoop
    from openmanus_rl_core.config.schema import RolloutConfig

    template = build("template", {"name": "react", "kwargs": {}})
    env_cfg = {"name": "key_door", "kwargs": {}}
    loop = AgentLoop(Script(tok, replies), tok, template, lambda: build("env", env_cfg),
                     RolloutConfig(max_turns=4))
    [ep] = loop.run([{"task_id": 3, "seed": 0, "group_id": "g"}])
    return ep, template, build("env", env_cfg)


def _play(client, env, template, messages_of, rounds=4):
    """The key_door agent's loop: ``messages_of(history)`` is what it sends."""
    history = [{"role": "system", "content": template.system_prompt(env.instruction)},
               {"role": "user", "content": env.reset(3, 0)}]
    for _ in range(rounds):
        reply = client.chat.completions.create(model="omrl-policy", messages=messages_of(history)
                                               ).choices[0].message.content
        history.append({"role": "assistant", "content": reply})
        result = env.step(template.parse(reply).content)
        if result.done:
            return result
        history.append({"role": "user", "content": result.observation})
    return result


def test_a_multi_turn_episode_is_the_very_tokens_the_agent_loop_builds(gateway, tok):
    """The same replies through our agent loop and through an OpenAI-client agent: one sample each, id for id."""
    from openmanus_rl_env_text.key_door import KeyDoorEnv

    password = KeyDoorEnv().words[3]
    replies = ["<think>look</think><action>open box</action>", f"<action>say {password}</action>"]
    theirs, template, env = _agent_loop_episode(tok, replies)
    assert theirs.trajectory.success and theirs.trajectory.num_turns == 2
    gw = gateway(replies)
    key = gw.open_episode({"task_id": 3, "seed": 0, "group_id": "g"})
    result = _play(openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0), env, template, list)
    assert result.done and result.info["success"]
    ours = episode_from_record(gw.close_episode(key), template)
    assert ours.trajectory.info["gateway"] == "continuous" and not ours.contexts
    assert ours.prompt_ids == theirs.prompt_ids
    assert ours.response_ids == theirs.response_ids
    assert ours.response_mask == theirs.response_mask
    assert ours.logprobs == theirs.logprobs
    assert [t.span for t in ours.trajectory.turns] == [t.span for t in theirs.trajectory.turns]
    assert [t.action.content for t in ours.trajectory.turns] == ["open box", f"say {password}"]


def test_a_harness_that_rewrites_its_history_starts_a_new_segment_at_each_call(gateway, tok):
    from openmanus_rl_env_text.key_door import KeyDoorEnv

    env = KeyDoorEnv()
    replies = ["<action>open box</action>", f"<action>say {env.words[3]}</action>"]
    _, template, _ = _agent_loop_episode(tok, replies)
    gw = gateway(replies)
    key = gw.open_episode({"task_id": 3, "seed": 0, "group_id": "g"})
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    _play(client, env, template, lambda history: [history[0], history[-1]])  # only the latest observation
    record = gw.close_episode(key)
    ep = episode_from_record(record, template)
    # Every call rewrote the history: each is a segment of its own, one sample each (gateway/episodes.py).
    assert ep.trajectory.info["gateway"] == "segments" and ep.trajectory.info["gateway_segments"] == 2
    assert ep.contexts == [c.prompt_ids for c in record.calls] and len(ep.contexts) == 2
    assert ep.response_ids == record.calls[0].completion_ids + record.calls[1].completion_ids
    assert set(ep.response_mask) == {1} and ep.logprobs == [-0.25] * len(ep.response_ids)
    # Each sample is exactly what the policy saw and produced.
    assert gw.batcher.engine.prompts == ep.contexts
