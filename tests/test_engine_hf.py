"""The Hugging Face rollout engine (openmanus_rl_core/engines/hf.py)."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.engines.hf import HFEngine, filter_logits
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.protocols import RolloutEngine, SamplingParams

TEXTS = ["<action>open box</action> The box is open.", "say apple", "the note says: pear"] * 4 + [
    f"token {i} words here" for i in range(30)
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(TEXTS, vocab_size=360)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            seed=1)


@pytest.fixture()
def engine(model, tok):
    return HFEngine(model, tok, seed=0, num_threads=1)


def _prompts(tok):
    texts = ["hello", "the box is open. say", "token 3 words here and a much longer prompt than the others", "x"]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def _recompute(model, prompt, gen_ids, temperature):
    ids = torch.tensor([list(prompt) + list(gen_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1: -1]
    return lp.gather(-1, torch.tensor(gen_ids)[:, None])[:, 0]


def test_engine_is_registered_and_conforms(engine):
    from openmanus_rl_core.plugin.registry import registry

    assert registry("engine").get("hf") is HFEngine
    assert isinstance(engine, RolloutEngine)
    assert engine.generate([], SamplingParams()) == []


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 20)])
def test_logprobs_match_a_forward_pass(engine, model, tok, temperature, top_p, top_k):
    prompts = _prompts(tok)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=temperature, top_p=top_p,
                                                   top_k=top_k))
    assert len(gens) == len(prompts)
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) > 0
        ref = _recompute(model, p, g.token_ids, temperature)
        assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4), (ref, g.logprobs)


def test_greedy_is_deterministic_batch_invariant_and_matches_hf_generate(engine, model, tok):
    prompts = _prompts(tok)
    params = SamplingParams(max_new_tokens=16, greedy=True)
    a = engine.generate(prompts, params)
    b = engine.generate(prompts, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for p, g in zip(prompts, a):
        alone = engine.generate([p], params)[0]
        assert alone.token_ids == g.token_ids  # left padding does not change a row's output
        ref = model.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        assert g.token_ids == ref
        assert torch.allclose(_recompute(model, p, g.token_ids, 1.0), torch.tensor(g.logprobs), atol=1e-4)
    # temperature 0 means greedy too; top_k=1 sampling is the argmax as well.
    zero = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0.0))
    top1 = engine.generate(prompts, SamplingParams(max_new_tokens=16, top_k=1))
    assert [g.token_ids for g in zero] == [g.token_ids for g in a] == [g.token_ids for g in top1]


def test_sampling_seeded_by_the_engine(model, tok):
    prompts = _prompts(tok)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    a = HFEngine(model, tok, seed=5).generate(prompts, params)
    b = HFEngine(model, tok, seed=5).generate(prompts, params)
    c = HFEngine(model, tok, seed=6).generate(prompts, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_max_new_tokens_gives_length(engine, tok):
    gens = engine.generate(_prompts(tok), SamplingParams(max_new_tokens=7, greedy=True))
    for g in gens:
        assert len(g.token_ids) == 7 and g.finish_reason == "length"
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
    assert all(g.token_ids == [] and g.finish_reason == "length"
               for g in engine.generate(_prompts(tok), SamplingParams(max_new_tokens=0)))


def test_stop_strings_per_sequence(engine, tok):
    prompts = _prompts(tok)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=30, greedy=True))
    # For each row, a stop string that first completes at a different token of its own greedy output.
    stops, cut_at = [], []
    for k, g in enumerate(free):
        j = min(3 + 4 * k, len(g.token_ids) - 1)
        prefix = tok.decode(g.token_ids[: j + 1])
        stop = prefix[-2:] if len(prefix) >= 2 else prefix
        stops.append(stop)
    # Run each row with its own stop string; the batch run with all stops must agree with single-row runs.
    singles = [engine.generate([p], SamplingParams(max_new_tokens=30, greedy=True, stop=[s]))[0]
               for p, s in zip(prompts, stops)]
    for g_free, g, s in zip(free, singles, stops):
        assert g.finish_reason == "stop"
        assert s in g.text
        # The first token after which the text contains the stop string is the last token kept.
        first = next(i for i in range(1, len(g_free.token_ids) + 1) if s in tok.decode(g_free.token_ids[:i]))
        assert g.token_ids == g_free.token_ids[:first]
        cut_at.append(first)
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=30, greedy=True, stop=stops))
    for g_free, g in zip(free, batch):
        first = next((i for i in range(1, len(g_free.token_ids) + 1)
                      if any(s in tok.decode(g_free.token_ids[:i]) for s in stops)), None)
        if first is None:
            assert g.token_ids == g_free.token_ids and g.finish_reason == g_free.finish_reason
        else:
            assert g.token_ids == g_free.token_ids[:first] and g.finish_reason == "stop"


def test_eos_stops_each_sequence(model, tok):
    engine = HFEngine(model, tok)
    prompts = _prompts(tok)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=20, greedy=True))
    # Declare as EOS a token that each greedy output reaches at a different point (or never).
    eos = free[0].token_ids[4]
    engine.eos_token_ids = {eos}
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=20, greedy=True))
    for f, g in zip(free, gens):
        if eos in f.token_ids:
            k = f.token_ids.index(eos)
            assert g.token_ids == f.token_ids[: k + 1] and g.finish_reason == "stop"
        else:
            assert g.token_ids == f.token_ids and g.finish_reason == "length"


def test_real_eos_token_ends_generation_and_is_kept(model, tok):
    engine = HFEngine(model, tok)
    eos = tok.eos_token_id

    def boost(_module, _inp, out):  # make <|im_end|> the most likely token everywhere
        out[..., eos] += 1e4
        return out

    handle = model.lm_head.register_forward_hook(boost)
    try:
        gens = engine.generate(_prompts(tok), SamplingParams(max_new_tokens=10, temperature=1.0))
    finally:
        handle.remove()
    for g in gens:
        assert g.token_ids == [eos] and g.finish_reason == "stop" and g.text == ""


def test_update_weights_in_memory(model, tok):
    other = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                             seed=99)
    mine = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            seed=1)
    engine = HFEngine(mine, tok)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    prompts = _prompts(tok)
    want = HFEngine(other, tok).generate(prompts, params)
    sd = {k: v.clone() for k, v in other.state_dict().items()}
    sd.pop("lm_head.weight", None)  # tied: may be omitted
    engine.update_weights(sd)
    got = engine.generate(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    with pytest.raises(RuntimeError):
        engine.update_weights({**sd, "bogus.weight": torch.zeros(1)})


def test_sleep_and_wake_keep_the_weights_and_generate_wakes_it(model, tok):
    engine = HFEngine(model, tok, seed=0)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    prompts = _prompts(tok)
    want = [g.token_ids for g in engine.generate(prompts, params)]
    engine.sleep()
    engine.sleep()  # idempotent
    assert engine.asleep and next(engine.model.parameters()).device.type == "cpu"
    assert [g.token_ids for g in engine.generate(prompts, params)] == want  # woke by itself, same weights
    assert not engine.asleep
    engine.sleep()
    engine.update_weights({k: v.clone() for k, v in model.state_dict().items()})
    assert not engine.asleep  # a weight push wakes it too
    engine.wake_up()  # awake already: nothing happens
    assert [g.token_ids for g in engine.generate(prompts, params)] == want


def test_empty_prompt_is_an_error(engine):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[1, 2], []], SamplingParams(max_new_tokens=2))


def test_filter_logits():
    z = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(z, top_k=2)).tolist() == [[True, False, False, True]]
    p = torch.softmax(z, -1)[0]  # ~ [.09, .64, .24, .03]
    kept = ~torch.isinf(filter_logits(z, top_p=0.7))
    assert kept.tolist() == [[False, True, True, False]]
    assert (~torch.isinf(filter_logits(z, top_p=0.5))).tolist() == [[False, True, False, False]]
    assert float(p[1]) > 0.5
