"""``memory=summary`` with a model writer (issue #24): the policy or a served engine writes the summary of the turns
that left the window, within a token budget, never trained on, falling back to the rule summary on an unusable
answer; and a short training run with the policy writing."""

from __future__ import annotations

import json
import re
import time

import pytest

from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.engines.served import ServedModelError
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.protocols import Generation, PastTurn, Summary
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, build_batch, expand_tasks, tokenizer_corpus
from openmanus_rl_core.testing import check_memory
from tests.fake_openai import FakeOpenAI

WINDOW, BUDGET = 4, 24
# What the scripted writer answers, in turn: a long overrun, nothing, punctuation only, a short summary.
ANSWERS = [" ".join(f"station{k} passed" for k in range(200)), "", " ...!? ", "All stations so far are passed."]


def memory(**kwargs):
    return build("memory", {"name": "summary", "kwargs": {"window": WINDOW, "max_chars": 200, **kwargs}})


@pytest.fixture(scope="module")
def relay():
    """The react template, a 60-station relay and a tokenizer trained on its episodes."""
    from openmanus_rl_env_text.relay import RelayEnv

    template = build("template", {"name": "react", "kwargs": {}})
    env_factory = lambda: RelayEnv(length=60, padding=3, num_tasks=100)  # noqa: E731
    tok = build_tokenizer(tokenizer_corpus(env_factory, template, [{"task_id": i, "seed": 0} for i in range(4)])
                          + ANSWERS, vocab_size=400)
    return tok, template, env_factory


def is_writer_prompt(text: str) -> bool:
    return "Turns to add:" in text


class ScriptedEngine:
    """Plays the relay perfectly (says the last word a sign showed) and answers summary requests from ``ANSWERS`` in
    turn; records each call's prompt texts."""

    def __init__(self, tok):
        self.tok, self.calls, self.written = tok, [], 0

    def generate(self, prompts, params):
        texts = [self.tok.decode(p, skip_special_tokens=False) for p in prompts]
        self.calls.append((texts, params))
        out = []
        for text in texts:
            if is_writer_prompt(text):  # by the number of the turn it adds: the same answers in every episode
                reply = ANSWERS[(int(re.findall(r"Turn (\d+):", text)[-1]) - 1) % len(ANSWERS)]
                self.written += 1
            else:
                reply = "<action>say " + re.findall(r"shows the word: (\w+)", text)[-1] + "</action>"
            ids = self.tok.encode(reply, add_special_tokens=False)
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=reply, finish_reason="stop"))
        return out


def test_the_summary_memory_takes_its_writer_settings_and_passes_the_kit():
    for kw in ({}, {"writer": "policy", "max_summary_tokens": 16}):
        check_memory(memory(**kw))
    assert (memory().summary_tokens, memory(writer="policy").summary_tokens) == (0, 128)
    # The conformance kit calls messages without a summary: the rule summary stands in.
    turns = [PastTurn(f"r{k}", f"a{k}", f"o{k}") for k in range(6)]
    assert memory(writer="policy").messages("S", "T", turns)[1]["content"] == "T\n\nEarlier turns:\n1. a0 -> o0\n2. a1 -> o1"
    with_summary = memory(writer="policy").messages("S", "T", turns, summary=Summary("went far", 2))
    assert with_summary[1]["content"] == "T\n\nEarlier turns:\nwent far"
    request = memory(writer="policy").summary_request("S", "T", turns, Summary("went far", 1))
    assert request.turns == 2 and "Summary so far:\nwent far" in request.messages[1]["content"]
    assert "Turn 2: a1\nObservation: o1" in request.messages[1]["content"] and "Turn 1:" not in request.messages[1]["content"]
    assert memory(writer="policy").summary_request("S", "T", turns, Summary("x", 2)) is None
    with pytest.raises(ValueError, match="max_summary_tokens=0: must be an int >= 1"):
        memory(writer="policy", max_summary_tokens=0)


def test_the_kit_fails_a_memory_that_asks_for_turns_that_do_not_exist():
    from openmanus_rl_core.protocols import SummaryRequest
    from openmanus_rl_core.testing import ConformanceError

    class Greedy(type(memory())):
        def summary_request(self, system, task, history, summary):
            return SummaryRequest([{"role": "user", "content": "x"}], len(history) + 1)

    with pytest.raises(ConformanceError, match="covering more turns than the summary does, at most the 0 there are"):
        check_memory(Greedy(window=WINDOW, max_chars=200, writer="policy"))


@pytest.mark.parametrize("mode", ["lockstep", "episodes"])
def test_a_60_turn_relay_keeps_every_written_summary_within_its_budget_and_never_trains_on_it(relay, mode):
    tok, template, env_factory = relay
    cfg = RolloutConfig(max_turns=60, max_new_tokens=24, max_sample_tokens=1024, mode=mode)
    engine = ScriptedEngine(tok)
    loop = AgentLoop(engine, tok, template, env_factory, cfg, memory=memory(writer="policy", max_summary_tokens=BUDGET))
    episodes = loop.run(expand_tasks([{"task_id": 3, "seed": 0}], 2))
    writes = 60 - (WINDOW + 1)  # before replies 5..59: turns leave the window one at a time
    for ep in episodes:
        info = ep.trajectory.info
        assert (ep.trajectory.num_turns, ep.trajectory.termination, ep.trajectory.success) == (60, "done", True)
        assert len(info["summary_tokens"]) == writes and max(info["summary_tokens"]) <= BUDGET
        # Answers cycle overrun / empty / punctuation / short: a quarter cut to the budget, half replaced by the rule.
        assert info["summary_cut"] == 14 and info["summary_fallbacks"] == 28
        assert info["summary_tokens"][0] == BUDGET
        # Every context after the window shows a summary; the response holds the 60 replies and nothing else.
        assert all("Earlier turns:" in tok.decode(c) for c in ep.contexts[WINDOW + 1:])
        assert not any("Earlier turns:" in tok.decode(c) for c in ep.contexts[: WINDOW + 1])
        replies = [tok.encode(t.response, add_special_tokens=False) for t in ep.trajectory.turns]
        assert ep.response_ids == [i for r in replies for i in r] and ep.response_mask == [1] * len(ep.response_ids)
    # Before reply 5 the overrun, cut to 24 tokens; then the rule's summary (max_chars=200 holds no whole relay line)
    # in place of the empty and the punctuation answers; then the short answer as written.
    shown = [tok.decode(episodes[0].contexts[t]).split("Earlier turns:\n")[1].split("<|im_end|>")[0] for t in (5, 6, 7, 8)]
    assert shown[0].startswith("station0 passed station1 passed") and len(tok.encode(shown[0])) <= BUDGET
    assert shown[1:] == ["(2 earlier turns not shown)", "(3 earlier turns not shown)", ANSWERS[3]]
    assert episodes[0].trajectory.info["summary_tokens"][:4] == [24, 21, 21, 12]
    writer_calls = [(texts, p) for texts, p in engine.calls if any(map(is_writer_prompt, texts))]
    assert all(all(map(is_writer_prompt, texts)) for texts, _ in writer_calls)  # never mixed with replies
    assert all(p.max_new_tokens == BUDGET and p.stop == [] for _, p in writer_calls)
    assert sum(len(texts) for texts, _ in writer_calls) == 2 * writes
    if mode == "lockstep":  # one writing call per turn over both live episodes
        assert [len(texts) for texts, _ in writer_calls] == [2] * writes
    batch = build_batch(episodes, None, build("allocator", {"name": "last_token", "kwargs": {}}), tok.pad_token_id)
    assert len(batch) == 120 and int(batch["response_mask"].sum()) == sum(len(e.response_ids) for e in episodes)


def test_the_tiny_policy_writes_summaries_within_the_budget_on_a_60_turn_relay(relay):
    tok, template, env_factory = relay
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    cfg = RolloutConfig(max_turns=60, max_new_tokens=16, max_sample_tokens=1024)
    loop = AgentLoop(HFEngine(model, tok, seed=0), tok, template, env_factory, cfg,
                     memory=memory(writer="policy", max_summary_tokens=16))
    (ep,) = loop.run([{"task_id": 1, "seed": 0}])
    info, turns = ep.trajectory.info, ep.trajectory.num_turns
    assert turns == 60 and len(info["summary_tokens"]) == 55 and max(info["summary_tokens"]) <= 16
    assert info.get("summary_cut", 0) >= 1  # its 16 tokens decoded and re-encoded run past 16: cut again
    assert all(len(c) + cfg.max_new_tokens <= 1024 for c in ep.contexts)
    assert loop.summaries.calls == len(info["summary_tokens"])


def test_a_served_writer_that_answers_nothing_falls_back_and_a_broken_one_is_one_clear_error(relay):
    tok, template, env_factory = relay
    cfg = RolloutConfig(max_turns=8, max_new_tokens=24, max_sample_tokens=1024)
    with FakeOpenAI(lambda body: "") as server:
        spec = {"name": "openai", "kwargs": {"base_url": server.url, "model": server.model, "timeout_s": 2.0,
                                             "backoff_s": 0.01, "max_retries": 1}}
        mem = memory(writer="engine", engine=spec, max_summary_tokens=BUDGET)
        (ep,) = AgentLoop(ScriptedEngine(tok), tok, template, env_factory, cfg, memory=mem).run(
            [{"task_id": 2, "seed": 0}])
        assert ep.trajectory.info["summary_fallbacks"] == 8 - (WINDOW + 1) == len(server.requests)
        assert all("Turns to add:" in tok.decode(r["prompt"]) for r in server.requests)
        # An answer that is not JSON: the rollout ends with the engine's one-line error, at once.
        server.faults.append(("raw", b"<html>oops"))
        mem2 = memory(writer="engine", engine=spec, max_summary_tokens=BUDGET)
        t0 = time.perf_counter()
        with pytest.raises(ServedModelError, match="the answer is not JSON: <html>oops"):
            AgentLoop(ScriptedEngine(tok), tok, template, env_factory, cfg, memory=mem2).run([{"task_id": 2, "seed": 0}])
        assert time.perf_counter() - t0 < 5


def test_a_writer_server_that_does_not_answer_is_one_line_naming_the_memory_setting(relay):
    import socket

    from openmanus_rl_core.engines import EngineUnavailableError

    tok, template, env_factory = relay
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    mem = memory(writer="engine", engine={"name": "openai", "kwargs": {"base_url": url, "model": "m"}})
    with pytest.raises(EngineUnavailableError, match=f"the served model at {url} does not answer .*; start the "
                                                     f"server or fix memory.kwargs.engine.kwargs.base_url"):
        AgentLoop(ScriptedEngine(tok), tok, template, env_factory, RolloutConfig(max_turns=8), memory=mem)


def test_a_writer_prompt_over_its_token_limit_keeps_its_end(relay):
    """A budget of 900 of rollout.max_sample_tokens=1024 leaves the writer's prompt 124 tokens, fewer than its chat
    holds: the prompt is the chat's last 124 tokens (the turns to add and the request to write), not its first."""
    tok, template, env_factory = relay
    budget, limit = 900, 1024 - 900
    prompts, requests = [], []

    class Engine:  # plays the relay; a call with the summary budget as max_new_tokens is the writer's
        def generate(self, batch, params):
            out = []
            for ids in batch:
                if params.max_new_tokens == budget:
                    prompts.append(list(ids))
                    reply = ANSWERS[3]
                else:
                    word = re.findall(r"shows the word: (\w+)", tok.decode(ids, skip_special_tokens=False))[-1]
                    reply = f"<action>say {word}</action>"
                reply_ids = tok.encode(reply, add_special_tokens=False)
                out.append(Generation(token_ids=reply_ids, logprobs=[-0.5] * len(reply_ids), text=reply,
                                      finish_reason="stop"))
            return out

    mem = memory(writer="policy", max_summary_tokens=budget)
    ask = mem.summary_request

    def recorded(*args):
        request = ask(*args)
        if request is not None:
            requests.append(request.messages)
        return request

    mem.summary_request = recorded
    loop = AgentLoop(Engine(), tok, template, env_factory,
                     RolloutConfig(max_turns=8, max_new_tokens=24, max_sample_tokens=1024), memory=mem)
    (ep,) = loop.run([{"task_id": 2, "seed": 0}])
    assert ep.trajectory.num_turns == 8 and len(prompts) == len(requests) == 8 - (WINDOW + 1)
    for messages, prompt in zip(requests, prompts):
        full = loop.chat.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        assert len(full) > limit and prompt == full[-limit:]
        text = tok.decode(prompt, skip_special_tokens=False)
        assert text.endswith(f"Write the updated summary in at most {budget} tokens. Reply with the summary only."
                             f"<|im_end|>\n<|im_start|>assistant\n")
        assert "You keep the record of an agent" not in text  # the writer's system line, at the start, is cut


@pytest.mark.slow
def test_training_with_the_policy_writing_its_summaries_runs_end_to_end(tmp_path, ray_local, command_here):
    """Three GRPO steps on the relay (the tiny model from config): each step's rollout writes summaries within the
    budget, and the update trains on the turn samples. ``openmanus-rl train``'s function (cli.main), in this process
    on the tests' shared Ray."""
    run = tmp_path / "run"
    proc = command_here(
        ["train", "env=relay", "env.max_turns=12", "memory=summary",
         "memory.kwargs.writer=policy", "memory.kwargs.max_summary_tokens=16", "rollout.max_sample_tokens=1024",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
         "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=2", "algorithm.n=2",
         "env.train_tasks=8", "env.val_tasks=2", "rollout.max_new_tokens=12", "warmup.enabled=false",
         "trainer.total_steps=3", "trainer.num_workers=1", "trainer.num_cpus=2", "trainer.progress=false",
         "trainer.loggers=[]", "trainer.val_before_train=false", "trainer.val_at_end=false", "trainer.val_freq=0",
         "trainer.save_freq=0", "trainer.save_at_end=false", f"trainer.run_dir={run}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        # 4 episodes of up to 12 turns, window 4: up to 7 summaries each, every one within 16 tokens.
        assert 1 <= r["rollout/summary_writes"] <= 28 and 0 < r["rollout/summary_tokens/max"] <= 16
        assert r["actor/num_updates"] >= 1 and r["perf/samples"] == r["rollout/turns/mean"] * 4
    saved = json.loads((run / "config.json").read_text())
    assert saved["memory"]["kwargs"]["writer"] == "policy"
