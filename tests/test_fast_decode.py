"""The HF engine's decoding step in plain torch calls (openmanus_rl_core/engines/fast_decode.py): for the
architectures it reads, generation through it equals generation through the model's own forward, before and after
new weights; every other model keeps its forward."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from openmanus_rl_core.engines.fast_decode import FastDecode
from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.protocols import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from uneven_update import save_small_model  # noqa: E402


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.config.schema import ModelConfig

    model, tok = load_model_and_tokenizer(ModelConfig(path=save_small_model(tmp_path_factory.mktemp("qwen2"))), [])
    with torch.no_grad():  # biases start at zero: give them values, so that a step that left them out shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model, tok


def _llama(vocab: int, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=256, **extra)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than the default init: the logits spread, samples differ
            p.mul_(3.0)
    return model


def _prompts(tok):
    texts = ["Say: apple", "Say: bird, then apple, then bird", "apple", "Say: bird"]
    return [tok(t)["input_ids"] for t in texts for _ in range(2)]


def _generate(model, tok, prompts, fast: bool, greedy: bool = False):
    engine = HFEngine(model, tok, seed=5, prefix_cache_mb=0, fast_decode=fast)
    assert (engine.fast is not None) == fast
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=1.0, top_k=0, greedy=greedy)
    return engine, engine.generate(prompts, params)


def _assert_same(a, b):
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    gap = max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.logprobs, h.logprobs))
    assert gap < 1e-5, gap


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_generation_through_the_fast_step_equals_the_models_forward(qwen2, arch):
    """Left-padded prompts of four lengths, sampled; Qwen2 has q/k/v biases, this Llama has none and 2 key-value
    heads for 4 query heads."""
    model, tok = qwen2
    if arch == "llama":
        model = _llama(len(tok))
    prompts = _prompts(tok)
    _, fast = _generate(model, tok, prompts, fast=True)
    _, slow = _generate(model, tok, prompts, fast=False)
    _assert_same(fast, slow)
    assert len({tuple(g.token_ids) for g in fast}) > 3  # the rows sampled different tokens


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("rows_leave", [True, False])
def test_long_replies_equal_the_models_forward(qwen2, arch, rows_leave):
    """150 new tokens, each layer's keys and values written in place into a slab with room for the call's steps.
    With ``rows_leave``, rows stop at scattered steps: the cache's rows are selected (new tensors), and the next
    step copies them into a new slab while the others go on; without, one slab per layer fills to its last column."""
    model, tok = qwen2
    if arch == "llama":
        model = _llama(len(tok))
    prompts = _prompts(tok)
    params = SamplingParams(max_new_tokens=150, temperature=1.0, top_p=1.0, top_k=0)
    gens = []
    for fast in (True, False):
        engine = HFEngine(model, tok, seed=7, prefix_cache_mb=0, fast_decode=fast)
        engine.eos_token_ids = set(range(40, 44)) if rows_leave else set()  # a few common ids end rows early
        gens.append(engine.generate(prompts, params))
        if fast:
            assert engine.fast.slabs == []  # a finished call keeps no cache memory
    _assert_same(*gens)
    lengths = sorted(len(g.token_ids) for g in gens[0])
    if rows_leave:
        assert lengths[-1] > 70 and lengths[0] < lengths[-1], lengths
    else:
        assert lengths == [150] * len(prompts)


def test_new_weights_reach_the_fast_step(qwen2):
    """The fused q/k/v and gate/up products are read again after ``update_weights``."""
    model, tok = qwen2
    prompts = _prompts(tok)
    engine, before = _generate(model, tok, prompts, fast=True, greedy=True)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
           for k, v in model.state_dict().items()}
    engine.update_weights(new)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    after = engine.generate(prompts, params)
    reference = HFEngine(engine.model, tok, prefix_cache_mb=0, fast_decode=False).generate(prompts, params)
    _assert_same(after, reference)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]


def test_other_models_keep_their_own_forward(qwen2):
    from transformers import GPT2Config, GPT2LMHeadModel

    model, tok = qwen2
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert FastDecode.for_model(gpt2) is None
    assert FastDecode.for_model(_llama(len(tok), attention_bias=True)) is not None
    sliding = _llama(len(tok))
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert FastDecode.for_model(sliding) is None
    mixed = _llama(len(tok))
    mixed.model.layers[1].self_attn.k_proj.bias = torch.nn.Parameter(torch.zeros(16))
    assert FastDecode.for_model(mixed) is None
    assert FastDecode.for_model(model) is not None
