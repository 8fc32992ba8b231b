"""Episodes stay whole (openmanus_rl_core/gateway/episodes.py) and tools always reach the model
(openmanus_rl_core/gateway/tools.py).

With Qwen3's REAL chat template (tests/templates/Qwen-Qwen3-0.6B.jinja), which drops the ``<think>`` blocks of
earlier turns, a 5-turn tool-using episode is one sample whose response tokens, where the mask is 1, are exactly what
the policy generated; with its history trimmed mid-episode it is two segments, the calls before the break one sample.
The requests go the gateway's way: parsed by :class:`ChatRequest`, the prompt built by :func:`prompt_for`, the reply
read back by the family's parsers; the "engine" is the test's script (the replies are input, not what is tested)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openmanus_rl_core.gateway.episodes import episode_from_record, prompt_for, segments
from openmanus_rl_core.gateway.tools import reply_text
from openmanus_rl_core.gateway.requests import ChatRequest
from openmanus_rl_core.gateway.records import Call, EpisodeRecord
from openmanus_rl_core.gateway.tools import ChatRenderer

QWEN3 = (Path(__file__).parent / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the docs",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tok():
    from openmanus_rl_core.models.loading import build_tokenizer
    from tiny_hf import TEXTS

    return build_tokenizer(TEXTS + ["<think>\nI should search.\n</think>", "<tool_call>", "</tool_call>"],
                           vocab_size=400)


def _qwen3(tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = QWEN3
    return t


class Gateway:
    """The gateway's request path without HTTP: request -> prompt_for -> scripted generation -> recorded Call ->
    the OpenAI-shaped reply the agent gets (reasoning split out, calls parsed)."""

    def __init__(self, tok, replies):
        self.tok, self.replies = tok, list(replies)
        self.chat = ChatRenderer(tok)
        self.record = EpisodeRecord(key="k", task={"task_id": 0})
        self.engine_prompts: list[list[int]] = []
        self.generated: list[list[int]] = []

    def create(self, messages, tools=TOOLS) -> dict:
        req = ChatRequest.parse({"model": "m", "messages": messages, "tools": tools}, "m")
        prompt = prompt_for(self.record, req.messages, req.tools, self.chat)
        completion = self.tok.encode(self.replies[len(self.generated)], add_special_tokens=False) + [
            self.tok.eos_token_id]
        self.engine_prompts.append(list(prompt.ids))
        self.generated.append(completion)
        text = reply_text(self.tok, completion)
        call = Call(list(prompt.ids), completion, [-0.5] * len(completion), 3, text, "stop",
                    last_message=req.messages[-1]["content"])
        call.messages, call.tools, call.bridged = req.messages, req.tools, prompt.bridged
        self.record.calls.append(call)
        reasoning, rest = self.chat.reasoning_parser.split(text)
        content, calls = self.chat.tool_parser.parse(rest, req.tools)
        message = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        return message


def _thinking_call(i: int) -> str:
    return (f"<think>\nI should search for part {i}.\n</think>\n\n<tool_call>\n"
            f'{{"name": "search", "arguments": {{"query": "part {i}"}}}}\n</tool_call>')


REPLIES = [_thinking_call(i) for i in range(4)] + ["<think>\nI have all parts.\n</think>\n\nRay is a runtime."]


def _play(gw, trim_at=None):
    """A tool-using agent, as the openai SDK's users write it: the assistant message goes back as the gateway gave
    it (no reasoning), each call answered by a tool message. ``trim_at``: before that call, the agent trims its
    history to its system and user messages and the latest exchange (a trimming memory), and goes on from there."""
    history = [{"role": "system", "content": "Answer with the docs."}, {"role": "user", "content": "what is ray?"}]
    for i in range(len(REPLIES)):
        if i == trim_at:
            history = history[:2] + history[-2:]
        reply = gw.create(history)
        history.append(reply)
        for call in reply.get("tool_calls", []):
            query = json.loads(call["function"]["arguments"])["query"]
            history.append({"role": "tool", "tool_call_id": call["id"], "content": f"the docs on {query}"})
    return history


def test_qwen3s_template_drops_the_thinking_so_a_fresh_render_would_break_the_episode(tok):
    gw = Gateway(_qwen3(tok), REPLIES)
    history = _play(gw)
    first = gw.record.calls[0]
    second = ChatRequest.parse({"model": "m", "messages": history[:4]}, "m").messages
    fresh = gw.chat.ids(second, TOOLS)  # the second request as the template renders it
    head = first.prompt_ids + first.completion_ids
    assert fresh[:len(head)] != head and "I should search for part 0" not in gw.tok.decode(fresh)


def test_a_5_turn_tool_episode_under_qwen3s_template_is_one_sample_of_exactly_the_generated_tokens(tok):
    gw = Gateway(_qwen3(tok), REPLIES)
    _play(gw)
    calls = gw.record.calls
    assert [c.bridged for c in calls] == [False, True, True, True, True]
    ep = episode_from_record(gw.record)
    info = ep.trajectory.info
    assert (info["gateway"], info["gateway_segments"], info["gateway_bridged"]) == ("continuous", 1, 4)
    assert ep.contexts == [] and ep.prompt_ids == gw.engine_prompts[0]
    # mask 1 exactly on the generated tokens, in order; every other token is the template's (mask 0)
    generated = [t for ids in gw.generated for t in ids]
    assert [t for t, m in zip(ep.response_ids, ep.response_mask) if m] == generated
    assert sum(ep.response_mask) == len(generated)
    assert [ep.response_ids[s:e] for s, e in ep.trajectory.segments] == gw.generated
    assert [ep.logprobs[i] for i, m in enumerate(ep.response_mask) if m] == [-0.5] * len(generated)
    assert set(v for v, m in zip(ep.versions, ep.response_mask) if not m) == {-1}
    # each call's context is what the engine generated from: the one sample holds them all
    for t, prompt in enumerate(gw.engine_prompts):
        assert ep.context_ids(t) == prompt
    assert ep.prompt_ids + ep.response_ids == gw.engine_prompts[-1] + gw.generated[-1]
    # the masked tokens between two replies are the tool's answer as the template writes it
    s, e = ep.trajectory.turns[0].span[1], ep.trajectory.turns[1].span[0]
    assert gw.tok.decode(ep.response_ids[s:e]) == ("\n<|im_start|>user\n<tool_response>\nthe docs on part 0\n"
                                                   "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "I should search for part 0" in gw.tok.decode(gw.engine_prompts[-1])


def test_with_its_history_trimmed_mid_episode_it_is_two_segments_the_calls_before_the_break_one_sample(tok,
                                                                                                  tmp_path):
    gw = Gateway(_qwen3(tok), REPLIES)
    _play(gw, trim_at=3)
    calls = gw.record.calls
    assert [c.bridged for c in calls] == [False, True, True, False, True]
    assert segments(calls) == [[0, 1, 2], [3, 4]]
    ep = episode_from_record(gw.record)
    info = ep.trajectory.info
    assert (info["gateway_segments"], info["gateway_bridged"]) == (2, 3)
    generated = [t for ids in gw.generated for t in ids]
    assert [t for t, m in zip(ep.response_ids, ep.response_mask) if m] == generated
    for t, prompt in enumerate(gw.engine_prompts):
        assert ep.context_ids(t) == prompt
    # one sample per segment
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.rollout import build_batch

    assert info["gateway"] == "segments" and ep.context_turns == [0, 3]
    assert ep.contexts == [gw.engine_prompts[0], gw.engine_prompts[3]]
    batch = build_batch([ep], None, build("allocator", {"name": "last_token", "kwargs": {}}), pad_token_id=0)
    rows = [[t for t, m in zip(r.tolist(), a.tolist()) if m] for r, a in
            zip(batch.tensors["input_ids"], batch.tensors["attention_mask"])]
    # each row: the segment's first prompt, then its replies with the masked tokens between them
    assert rows == [gw.engine_prompts[2] + gw.generated[2], gw.engine_prompts[4] + gw.generated[4]]
    generated = [[t for t, m in zip(r.tolist(), k.tolist()) if m] for r, k in
                 zip(batch.tensors["responses"], batch.tensors["response_mask"])]
    assert generated == [sum(gw.generated[:3], []), sum(gw.generated[3:], [])]
    assert list(batch.non_tensors["uid"]) == [f"{ep.uid}:0", f"{ep.uid}:1"]
    # a rollout dump names each segment's sample by its first turn
    import pyarrow.parquet as pq

    from openmanus_rl_core.run.dumps import write_dump

    batch.non_tensors["group_ids"] = ["g"] * len(batch)
    path, _ = write_dump(tmp_path, 1, batch, "f" * 64)
    assert pq.read_table(path, columns=["turn"]).column("turn").to_pylist() == [0, 3]


def test_a_reply_sent_back_edited_or_other_tools_start_a_new_segment(tok):
    gw = Gateway(_qwen3(tok), REPLIES[:3])
    history = [{"role": "user", "content": "what is ray?"}]
    reply = gw.create(history)
    reply["tool_calls"][0]["function"]["arguments"] = json.dumps({"query": "something else"})
    history += [reply, {"role": "tool", "tool_call_id": "x", "content": "r"}]
    gw.create(history)
    gw.create(history + [{"role": "assistant", "content": "Ray."}, {"role": "user", "content": "more"}],
              tools=TOOLS + [{"type": "function", "function": {"name": "open", "parameters": {}}}])
    assert [c.bridged for c in gw.record.calls] == [False, False, False]
    assert segments(gw.record.calls) == [[0], [1], [2]]


def test_tool_call_json_re_spaced_by_the_embedded_default_template_is_bridged(tok):
    """The embedded default renders a call as ``{"name": "search", "arguments": {...}}``; a model that wrote it
    without spaces would otherwise lose continuity at every call."""
    compact = ['<tool_call>\n{"name":"search","arguments":{"query":"part 0"}}\n</tool_call>', "Done."]
    gw = Gateway(tok, compact)
    history = [{"role": "user", "content": "what is ray?"}]
    reply = gw.create(history)
    gw.create(history + [reply, {"role": "tool", "tool_call_id": "x", "content": "r"}])
    assert [c.bridged for c in gw.record.calls] == [False, True]
    ep = episode_from_record(gw.record)
    assert ep.trajectory.info["gateway"] == "continuous"
    assert [ep.response_ids[s:e] for s, e in ep.trajectory.segments] == gw.generated


def test_a_conversation_the_template_renders_back_exactly_is_continuous_without_a_bridge(tok):
    gw = Gateway(tok, ['<tool_call>\n{"name": "search", "arguments": {"query": "a"}}\n</tool_call>', "Done."])
    history = [{"role": "user", "content": "what is ray?"}]
    reply = gw.create(history)
    gw.create(history + [reply, {"role": "tool", "tool_call_id": "x", "content": "r"}])
    assert [c.bridged for c in gw.record.calls] == [False, False]
    assert segments(gw.record.calls) == [[0, 1]]


def test_the_gateway_metrics_count_segments_and_bridged_calls(tok):
    from openmanus_rl_core.rollout.metrics import rollout_metrics

    eps = []
    for trim in (None, 3):
        gw = Gateway(_qwen3(tok), REPLIES)
        _play(gw, trim_at=trim)
        eps.append(episode_from_record(gw.record))
    m = rollout_metrics(eps)
    assert m["gateway/continuous_episodes"] == 1 and m["gateway/segmented_episodes"] == 1
    assert m["gateway/segments/mean"] == 1.5 and m["gateway/segments/max"] == 2
    assert m["gateway/bridged_calls"] == 4 + 3


# ------------------------------------------------------------------------------------ tools reach the model
PLAIN_CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                "{%- endif %}")


def test_a_template_without_tools_gets_them_in_the_system_prompt_with_one_notice(tok):
    import copy

    plain = copy.deepcopy(tok)
    plain.chat_template = PLAIN_CHATML
    told: list[str] = []
    chat = ChatRenderer(plain, notice=told.append)
    assert chat.renders_tools is False
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is ray?"}]
    text = chat.text(msgs, TOOLS)
    signature = json.dumps(TOOLS[0], ensure_ascii=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and f"<tools>\n{signature}\n</tools>" in text
    assert '<tool_call>\n{"name": "search", "arguments": {"query": "..."}}\n</tool_call>' in text
    assert chat.text(msgs[1:], TOOLS).startswith("<|im_start|>system\n# Tools\n")  # no system message: one is added
    assert chat.text(msgs, None) == plain.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert len(told) == 1 and "does not render tools" in told[0] and "hermes" in told[0]


def test_the_embedded_default_renders_tools_calls_and_tool_replies_itself(tok):
    chat = ChatRenderer(tok, notice=lambda line: pytest.fail(line))
    assert chat.renders_tools is True
    msgs = [{"role": "user", "content": "what is ray?"}]
    with_tools, without = chat.ids(msgs, TOOLS), chat.ids(msgs, None)
    assert len(with_tools) > len(without) + 40
    text = tok.decode(with_tools)
    assert f"<tools>\n{json.dumps(TOOLS[0], ensure_ascii=False)}\n</tools>" in text and "<tool_call>" in text
    # a plain conversation renders exactly as ChatML did (the prompt token counts of every run stay as they were)
    assert tok.decode(without) == "<|im_start|>user\nwhat is ray?<|im_end|>\n<|im_start|>assistant\n"
    reply = {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c", "type": "function", "function": {"name": "search", "arguments": {"q": 1}}}]}
    convo = chat.text(msgs + [reply, {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}], TOOLS)
    assert convo.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n'
                          "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
                          "<tool_response>\nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_takes_arguments_only_as_a_json_string_gets_them_so(tok):
    import copy

    ds = copy.deepcopy(tok)
    ds.chat_template = (Path(__file__).parent / "templates" / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()
    chat = ChatRenderer(ds)
    assert chat.tool_parser.name == "deepseek_v31"
    req = ChatRequest.parse({"model": "m", "messages": [
        {"role": "user", "content": "what is ray?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"query": "ray"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"}]}, "m")
    assert isinstance(req.messages[1]["tool_calls"][0]["function"]["arguments"], dict)  # as the gateway has them
    text = chat.text(req.messages, None)
    assert '<｜tool▁call▁begin｜>search<｜tool▁sep｜>{"query": "ray"}<｜tool▁call▁end｜>' in text
