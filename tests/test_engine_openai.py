"""The ``openai`` engine (a model served behind an OpenAI-compatible API) against a fake server on a thread:
requests and sampling settings, the stop string put back (and none after an end-of-text ending), an empty prompt
refused, bounded concurrency, retries (500, 429 with Retry-After), timeouts (a silent server, a body that never
ends), bad answers (not JSON, no choice), a dead port, chat messages recovered from the prompt, the key kept out of
every file a rollout writes (and no key sent without one), a server failing in the middle of a rollout (malformed
answer, empty choice, 429 with a long Retry-After, a body that never ends: one line, bounded time), and ``train``
refusing the engine."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openmanus_rl_core.engines import EngineUnavailableError
from openmanus_rl_core.engines.served import OpenAIEngine, ServedModelError
from openmanus_rl_core.rollout.chat import ChatSplit
from openmanus_rl_core.protocols import SamplingParams
from tests.fake_openai import FakeOpenAI, key_door_oracle

STOP = SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9, stop=["</action>"])


@pytest.fixture(scope="module")
def tokenizer():
    from openmanus_rl_core.models.loading import build_tokenizer
    from tests.tiny_hf import TEXTS

    return build_tokenizer(TEXTS + ["The note says: apple.", "open box", "say apple"], vocab_size=400)


def engine(server: FakeOpenAI, tokenizer, **kw) -> OpenAIEngine:
    return OpenAIEngine(base_url=server.url, model=server.model, tokenizer=tokenizer,
                        **{"backoff_s": 0.01, "timeout_s": 5.0, **kw})


def prompt(tokenizer, text: str = "You are in a room.") -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_request_carries_the_sampling_settings_and_the_reply_keeps_its_stop_string(tokenizer):
    with FakeOpenAI(lambda body: "<action>open box</action> and more") as server:
        gen = engine(server, tokenizer).generate([prompt(tokenizer)], STOP)[0]
    body = server.requests[0]
    assert body["prompt"] == prompt(tokenizer)  # the rollout's own token ids
    assert (body["model"], body["max_tokens"], body["temperature"], body["top_p"], body["stop"]) == (
        "served", 32, 0.7, 0.9, ["</action>"])
    assert "top_k" not in body
    assert gen.text == "<action>open box</action>" and gen.finish_reason == "stop"
    assert gen.token_ids == tokenizer.encode(gen.text, add_special_tokens=False)
    assert gen.logprobs == [0.0] * len(gen.token_ids)


def test_greedy_is_temperature_zero_and_a_named_stop_reason_is_the_one_put_back(tokenizer):
    params = SamplingParams(max_new_tokens=8, greedy=True, top_k=5, stop=["</action>", "</think>"])
    with FakeOpenAI(lambda body: "<think>hm</think> x", stop_reason=True) as server:
        gen = engine(server, tokenizer, prompt_as="text").generate([prompt(tokenizer)], params)[0]
    body = server.requests[0]
    assert (body["temperature"], body["top_p"], "top_k" in body) == (0.0, 1.0, False)
    assert body["prompt"] == "You are in a room."
    assert gen.text == "<think>hm</think>"


def test_a_reply_cut_by_the_token_limit_is_length_and_gets_no_stop_string(tokenizer):
    with FakeOpenAI(lambda body: "<action>open") as server:
        server.faults.append(("json", {"choices": [{"text": "<action>open", "finish_reason": "length"}]}))
        gen = engine(server, tokenizer).generate([prompt(tokenizer)], STOP)[0]
    assert (gen.text, gen.finish_reason) == ("<action>open", "length")


@pytest.mark.parametrize("ending", [
    None,  # the fake server's own answer: vLLM's `stop_reason: null`
    {"text": "<action>open box", "finish_reason": "stop", "matched_stop": None},  # SGLang, no stop string matched
    {"text": "<action>open box", "finish_reason": "stop", "matched_stop": 2},  # SGLang: the end-of-text token's id
], ids=["vllm stop_reason null", "sglang matched_stop null", "sglang matched_stop eos id"])
def test_a_reply_that_ended_on_end_of_text_gets_no_stop_string_appended(tokenizer, ending):
    """The request asked for one stop string, and the server says none was matched (the model ended its turn): the
    reply is left as the model wrote it, not given the stop string it never produced."""
    with FakeOpenAI(lambda body: "<action>open box", stop_reason=True) as server:
        if ending:
            server.faults.append(("json", {"choices": [ending]}))
        gen = engine(server, tokenizer).generate([prompt(tokenizer)], STOP)[0]
    assert server.requests[0]["stop"] == ["</action>"]
    assert (gen.text, gen.finish_reason) == ("<action>open box", "stop")
    assert gen.token_ids == tokenizer.encode("<action>open box", add_special_tokens=False)


def test_at_most_max_concurrency_requests_are_in_flight_and_replies_keep_their_order(tokenizer):
    def reply(body):
        time.sleep(0.15)
        return f"<action>{len(body['prompt'])}</action>"

    prompts = [prompt(tokenizer)[: k + 1] for k in range(6)]
    with FakeOpenAI(reply) as server:
        gens = engine(server, tokenizer, max_concurrency=2).generate(prompts, STOP)
    assert server.max_in_flight == 2
    assert [g.text for g in gens] == [f"<action>{k + 1}</action>" for k in range(6)]


def test_each_request_carries_a_seed_of_its_own_and_the_same_run_sends_the_same_seeds(tokenizer):
    """A server that honours ``seed`` (vLLM, SGLang) samples a run's replies again alike: each prompt's request has
    its own seed, drawn in the prompts' order from a generator seeded with the engine's ``seed``."""
    prompts = [prompt(tokenizer)[: k + 1] for k in range(5)]

    def seeds_sent(seed: int) -> list[int]:
        with FakeOpenAI(lambda body: f"<action>{len(body['prompt'])}</action>") as server:
            e = engine(server, tokenizer, max_concurrency=3, seed=seed)
            e.generate(prompts, STOP)
            e.generate(prompts[:2], STOP)
        by_prompt = sorted((len(b["prompt"]), i >= 5, b["seed"]) for i, b in enumerate(server.requests))
        return [s for _, _, s in by_prompt]

    first = seeds_sent(7)
    assert first == seeds_sent(7) and len(set(first)) == 7
    assert seeds_sent(8) != first


def test_an_empty_prompt_is_refused_before_any_request(tokenizer):
    with FakeOpenAI(lambda body: "<action>ok</action>") as server:
        with pytest.raises(ValueError, match="OpenAIEngine.generate got an empty prompt"):
            engine(server, tokenizer).generate([prompt(tokenizer), []], STOP)
    assert server.requests == []


def test_a_500_is_retried_and_a_429_waits_for_its_retry_after(tokenizer):
    with FakeOpenAI(lambda body: "<action>ok</action>") as server:
        e = engine(server, tokenizer)
        server.faults += [("status", 500, {}, "boom"), ("status", 429, {"Retry-After": "0.4"}, "slow down")]
        t0 = time.perf_counter()
        gen = e.generate([prompt(tokenizer)], STOP)[0]
        waited = time.perf_counter() - t0
    assert gen.text == "<action>ok</action>"
    assert len(server.requests) == 3 and e.stats["retries"] == 2
    assert waited >= 0.4


def test_retries_end_with_one_error_naming_the_url_and_the_last_failure(tokenizer):
    with FakeOpenAI(lambda body: "x") as server:
        e = engine(server, tokenizer, max_retries=2)
        server.faults += [("status", 503, {}, "overloaded")] * 3
        with pytest.raises(ServedModelError, match=r"/v1/completions: no answer after 3 attempts; the last: HTTP 503: "
                                                   r"overloaded"):
            e.generate([prompt(tokenizer)], STOP)


@pytest.mark.parametrize("fault", [("sleep", 3.0), ("trickle", 0.05)], ids=["silent", "never-ending body"])
def test_a_server_that_does_not_finish_its_answer_times_out_instead_of_hanging(tokenizer, fault):
    with FakeOpenAI(lambda body: "<action>late</action>") as server:
        e = engine(server, tokenizer, timeout_s=0.5, max_retries=1)
        server.faults += [fault, fault]
        t0 = time.perf_counter()
        with pytest.raises(ServedModelError, match="no answer after 2 attempts; the last: timed out"):
            e.generate([prompt(tokenizer)], STOP)
        assert time.perf_counter() - t0 < 2.5


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_the_server_is_checked_before_the_policy_is_loaded(model_dir, tmp_path, capsys, monkeypatch, command):
    """The preflight: with the server stopped, the error is the server's, and neither the model's check nor the
    policy (tokenizer, weights) came before it."""
    from openmanus_rl_core.cli import main as cli_main
    from openmanus_rl_core.commands import from_run
    from openmanus_rl_core.models import loading

    loads, checks = [], []
    monkeypatch.setattr(from_run, "load_policy", lambda *a, **k: loads.append(a))
    monkeypatch.setattr(loading, "check_model", lambda *a: checks.append(a))  # its tokenizer load: seconds
    url = _dead_url()
    rc = cli_main([command, "env=key_door", f"model.path={model_dir}", "rollout.engine=openai",
                   f"rollout.engine_kwargs.base_url={url}", "rollout.engine_kwargs.model=served"]
                  + [f"rollout.output_dir={tmp_path / 'out'}"] * (command == "rollout"))
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert (rc, len(errors), loads, checks) == (1, 1, [], []), errors
    assert errors[0].startswith(f"error: the served model at {url} does not answer (connection refused"), errors


@pytest.mark.parametrize("fault, message", [
    (("raw", b"<html>oops"), "the answer is not JSON: <html>oops"),
    (("json", {"choices": []}), "the answer has no choice"),
    (("json", {"choices": [{"finish_reason": "stop"}]}), "the choice has no text"),
    (("status", 400, {}, '{"error": "bad prompt"}'), 'HTTP 400: {"error": "bad prompt"}'),
])
def test_an_answer_retrying_cannot_fix_is_one_clear_error_at_once(tokenizer, fault, message):
    with FakeOpenAI(lambda body: "x") as server:
        e = engine(server, tokenizer)
        server.faults.append(fault)
        with pytest.raises(ServedModelError, match=message.replace("(", r"\(").replace("[", r"\[")):
            e.generate([prompt(tokenizer)], STOP)
        assert len(server.requests) == 1


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_a_dead_port_fails_at_construction_naming_the_url(tokenizer):
    url = _dead_url()
    t0 = time.perf_counter()
    with pytest.raises(EngineUnavailableError, match=f"the served model at {url} does not answer"):
        OpenAIEngine(base_url=url, model="m", tokenizer=tokenizer)
    assert time.perf_counter() - t0 < 2


def test_a_model_the_server_does_not_serve_is_named_with_what_it_serves(tokenizer):
    with FakeOpenAI(lambda body: "x", model="other") as server:
        with pytest.raises(EngineUnavailableError, match="does not serve model 'served'; it serves other"):
            OpenAIEngine(base_url=server.url, model="served", tokenizer=tokenizer)


def test_the_key_goes_only_into_the_authorization_header(tokenizer, monkeypatch):
    monkeypatch.setenv("OMRL_TEST_KEY", "sk-secret-123")
    with FakeOpenAI(lambda body: "<action>a</action>", key="sk-secret-123") as server:
        e = engine(server, tokenizer, api_key_env="OMRL_TEST_KEY")
        e.generate([prompt(tokenizer)], STOP)
        assert server.headers[0]["Authorization"] == "Bearer sk-secret-123"
        assert "sk-secret" not in repr(e) + json.dumps(server.requests)
        monkeypatch.setenv("OMRL_TEST_KEY", "wrong")
        with pytest.raises(EngineUnavailableError, match="refused the request \\(HTTP 401\\)"):
            engine(server, tokenizer, api_key_env="OMRL_TEST_KEY")


def test_without_api_key_env_no_key_from_the_environment_is_sent(tokenizer, monkeypatch):
    """The SDK reads OPENAI_API_KEY and OPENAI_ADMIN_KEY by itself; a served model without ``api_key_env`` must
    never receive them (nor any Authorization header)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-user-own-openai-key")
    monkeypatch.setenv("OPENAI_ADMIN_KEY", "sk-admin-own-openai-key")
    with FakeOpenAI(lambda body: "<action>a</action>") as server:
        engine(server, tokenizer).generate([prompt(tokenizer)], STOP)
    sent = server.get_headers + server.headers  # GET /models, then the request
    assert [h.get("Authorization") for h in sent] == [None, None]
    assert "own-openai-key" not in json.dumps(sent)


def test_chat_messages_are_recovered_from_the_rendered_prompt(tokenizer):
    msgs = [{"role": "system", "content": "Act."}, {"role": "user", "content": "A door.\nA box."},
            {"role": "assistant", "content": "<action>open box</action>"}, {"role": "user", "content": "Open."}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)
    assert ChatSplit(tokenizer).messages(ids) == msgs
    with FakeOpenAI(lambda body: "<action>say x</action>") as server:
        gen = engine(server, tokenizer, api="chat").generate([ids], STOP)[0]
    assert server.requests[0]["messages"] == msgs and "prompt" not in server.requests[0]
    assert gen.text == "<action>say x</action>"


# ------------------------------------------------------------------------------------------- the commands
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tests.tiny_hf import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("tiny") / "llama")


def test_rollout_with_a_served_expert_succeeds_and_no_written_file_holds_the_key(model_dir, tmp_path, monkeypatch,
                                                                                  capsys):
    from openmanus_rl_core.cli import main as cli_main
    from openmanus_rl_core.models.loading import load_tokenizer

    key = "sk-omrl-never-written-7f3a"
    monkeypatch.setenv("OMRL_SERVED_KEY", key)
    out = tmp_path / "rollout"
    with FakeOpenAI(key_door_oracle(load_tokenizer(str(model_dir))), key=key) as server:
        rc = cli_main(["rollout", "env=key_door", f"model.path={model_dir}", "rollout.engine=openai",
                       f"rollout.engine_kwargs.base_url={server.url}", "rollout.engine_kwargs.model=served",
                       "rollout.engine_kwargs.api_key_env=OMRL_SERVED_KEY", "rollout.num_tasks=4", "rollout.n=2",
                       "rollout.greedy=true", f"rollout.output_dir={out}"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "success rate: 1.000" in printed.out
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["success"] and r["num_turns"] == 2 for r in records)
    assert records[0]["turns"][0]["response"] == "<action>open box</action>"
    written = sorted(p for p in out.rglob("*") if p.is_file())
    assert [p.name for p in written] == ["metrics.json", "trajectories.html", "trajectories.jsonl"]
    for p in written:
        assert key not in p.read_text(errors="replace"), p
    assert key not in printed.out + printed.err


def test_rollout_against_a_stopped_server_ends_at_once_with_one_line_naming_the_url(model_dir, tmp_path, cli_env):
    url = _dead_url()
    t0 = time.perf_counter()
    proc = subprocess.run(["openmanus-rl", "rollout", "env=key_door", f"model.path={model_dir}",
                           "rollout.engine=openai", f"rollout.engine_kwargs.base_url={url}",
                           "rollout.engine_kwargs.model=served", f"rollout.output_dir={tmp_path / 'out'}"],
                          capture_output=True, text=True, env=cli_env, timeout=60)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: the served model at {url} does not answer "
                                                     f"(connection refused or reset"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 10, elapsed


@pytest.mark.parametrize("fault, message", [
    (("raw", b"<html>oops"), "the answer is not JSON: <html>oops"),
    (("json", {"choices": []}), "the answer has no choice"),
    (("status", 429, {"Retry-After": "3600"}, "rate limited"), "no answer after 2 attempts; the last: HTTP 429: "
                                                                "rate limited"),
    (("trickle", 0.05), "no answer after 2 attempts; the last: timed out"),
], ids=["malformed", "empty choice", "429 with an hour's Retry-After", "never-ending body"])
def test_a_server_failing_mid_rollout_ends_the_command_with_one_line_in_bounded_time(model_dir, tmp_path, capsys,
                                                                                      fault, message):
    """The first turn is answered; every request of the second turn meets the fault. The command ends (exit 1) with
    one line naming the URL: at once for an answer retrying cannot fix, after ``max_retries`` for the others (a
    Retry-After is capped by ``max_backoff_s``, a body by ``timeout_s``), never hanging."""
    from openmanus_rl_core.cli import main as cli_main
    from openmanus_rl_core.models.loading import load_tokenizer

    with FakeOpenAI(key_door_oracle(load_tokenizer(str(model_dir)))) as server:
        server.faults += [None, None] + [fault] * 4  # 2 episodes: turn 0 answered, turn 1 (and its retry) faulty
        t0 = time.perf_counter()
        rc = cli_main(["rollout", "env=key_door", f"model.path={model_dir}", "rollout.engine=openai",
                       f"rollout.engine_kwargs.base_url={server.url}", "rollout.engine_kwargs.model=served",
                       "rollout.engine_kwargs.max_retries=1", "rollout.engine_kwargs.backoff_s=0.01",
                       "rollout.engine_kwargs.max_backoff_s=0.2", "rollout.engine_kwargs.timeout_s=0.5",
                       "rollout.num_tasks=2", "rollout.n=1", "rollout.greedy=true",
                       f"rollout.output_dir={tmp_path / 'out'}"])
        elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 1 and len(errors) == 1, err
    assert errors[0].startswith(f"error: {server.url}/completions: ") and message in errors[0], errors[0]
    assert "Traceback" not in err
    retried = fault[0] in ("status", "trickle")
    assert len(server.requests) == 2 + 2 * (2 if retried else 1)  # both turn-1 requests, each retried once or not
    assert elapsed < 10, elapsed


def test_train_refuses_the_served_engine_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import sys; from openmanus_rl_core.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "train", "rollout.engine=openai",
                           "rollout.engine_kwargs.base_url=http://127.0.0.1:9/v1", "rollout.engine_kwargs.model=m",
                           f"trainer.output_dir={tmp_path / 'o'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: rollout.engine=openai: this engine cannot be trained (its model is served elsewhere: no weights to "
        "update, no log-probs); use it with `openmanus-rl rollout` or `eval`, and train with rollout.engine=hf or vllm"]
    assert not (tmp_path / "o").exists()


def test_a_misspelled_engine_setting_is_one_line_naming_it(tmp_path, capsys):
    from openmanus_rl_core.cli import main as cli_main

    assert cli_main(["rollout", "rollout.engine=openai", "rollout.engine_kwargs.base_ulr=http://x/v1",
                     f"rollout.output_dir={tmp_path}"]) == 2
    assert "rollout.engine_kwargs.base_ulr=http://x/v1: unknown key of the engine 'openai'; did you mean " \
           "rollout.engine_kwargs.base_url?" in capsys.readouterr().err


def test_eval_scores_a_served_model_on_the_validation_tasks(model_dir, tmp_path, capsys):
    from openmanus_rl_core.cli import main as cli_main
    from openmanus_rl_core.models.loading import load_tokenizer

    out = tmp_path / "eval.json"
    with FakeOpenAI(key_door_oracle(load_tokenizer(str(model_dir)))) as server:
        assert cli_main(["eval", "env=key_door", f"model.path={model_dir}", "rollout.engine=openai",
                         f"rollout.engine_kwargs.base_url={server.url}", "rollout.engine_kwargs.model=served",
                         "trainer.val_max_tasks=4", f"trainer.eval_output={out}"]) == 0
    result = json.loads(out.read_text())
    assert (result["tasks"], result["success_rate"], result["num_turns"]) == (4, 1.0, 2.0)
    assert all(body["temperature"] == 0.0 for body in server.requests)  # eval decodes greedily
