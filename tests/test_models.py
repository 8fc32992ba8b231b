"""The embedded default model and tokenizer (openmanus_rl_core/models/loading.py)."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.models.loading import (
    CHATML_TEMPLATE,
    IM_END,
    IM_START,
    ENDOFTEXT,
    apply_lora,
    build_tiny_model,
    build_tokenizer,
    load_model_and_tokenizer,
    lora_scaling,
    merge_lora_state,
)
from openmanus_rl_core.config.schema import LoraConfig, ModelConfig, TinyModelConfig

TEXTS = ["<action>open box</action>", "The box is open. The note says: apple.", "say apple"] * 3 + [
    f"word {i} and more words" for i in range(40)
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(TEXTS, vocab_size=400)


def test_tokenizer_special_tokens_and_padding(tok):
    assert tok.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) == [0, 1, 2]
    assert tok.eos_token == IM_END and tok.eos_token_id == 2
    assert tok.pad_token == ENDOFTEXT and tok.pad_token_id == 0
    assert tok.padding_side == "left"
    assert len(tok) <= 400
    # Special tokens are atomic even inside text.
    ids = tok.encode(f"a{IM_START}b{IM_END}", add_special_tokens=False)
    assert 1 in ids and 2 in ids


def test_tokenizer_deterministic_and_order_independent():
    a = build_tokenizer(TEXTS, vocab_size=400)
    b = build_tokenizer(list(reversed(TEXTS)), vocab_size=400)
    assert a.get_vocab() == b.get_vocab()
    s = "The note says: apple. <action>say apple</action>"
    assert a.encode(s) == b.encode(s)


def test_tokenizer_byte_level_round_trip(tok):
    for s in ["héllo wörld", "日本語 テキスト", "tabs\tand\nnewlines  ", "\x00\x01 odd bytes", "emoji 🎉"]:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s


def test_chat_template_chatml(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    msgs.append({"role": "assistant", "content": "A"})
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert text.endswith("<|im_start|>assistant\nA<|im_end|>\n")
    assert tok.chat_template == CHATML_TEMPLATE


def test_tokenizer_save_load_keeps_padding_side_and_template(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    t2 = AutoTokenizer.from_pretrained(str(tmp_path))
    assert t2.padding_side == "left"
    assert t2.eos_token == IM_END and t2.pad_token == ENDOFTEXT
    s = "<|im_start|>user\nword 3<|im_end|>\n"
    assert t2.encode(s, add_special_tokens=False) == tok.encode(s, add_special_tokens=False)
    msgs = [{"role": "user", "content": "x"}]
    assert t2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_vocab_too_small_is_an_error():
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(TEXTS, vocab_size=100)


def test_tiny_model_config_and_seed(tok):
    m = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)
    c = m.config
    assert type(m).__name__ == "Qwen2ForCausalLM"
    assert c.vocab_size == len(tok) and c.tie_word_embeddings
    assert c.eos_token_id == tok.eos_token_id and c.pad_token_id == tok.pad_token_id
    assert c.num_hidden_layers == 1 and c.num_key_value_heads == 2
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    m2 = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)
    m3 = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=4)
    sd, sd2, sd3 = m.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert not all(torch.equal(sd[k], sd3[k]) for k in sd)
    # Building a model does not move the caller's global RNG.
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64)
    assert torch.equal(torch.rand(1), a)
    out = m(torch.tensor([[1, 5, 6]]))
    assert out.logits.shape == (1, 3, len(tok))


def test_tiny_model_head_dim(tok):
    m = build_tiny_model(tok, hidden_size=48, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=64)
    assert m.config.head_dim == 32
    assert m.model.layers[0].self_attn.q_proj.out_features == 64


def test_load_model_and_tokenizer_tiny_then_by_path(tmp_path):
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, intermediate_size=64))
    assert cfg.path is None and cfg.lora.enabled is False
    m, t = load_model_and_tokenizer(cfg, corpus=TEXTS, save_dir=tmp_path / "m")
    assert t.padding_side == "left"
    assert m.config.hidden_size == 32 and m.config.initializer_range == TinyModelConfig.initializer_range
    m2, t2 = load_model_and_tokenizer(ModelConfig(path=str(tmp_path / "m")))
    assert t2.padding_side == "left" and t2.eos_token == IM_END
    assert t2.get_vocab() == t.get_vocab()
    sd, sd2 = m.state_dict(), m2.state_dict()
    assert set(sd) == set(sd2) and all(torch.equal(sd[k], sd2[k]) for k in sd)


def test_load_missing_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_model_and_tokenizer(ModelConfig(path=str(tmp_path / "nope")))


def test_dtype_option(tok):
    small = TinyModelConfig(hidden_size=32, intermediate_size=64)
    m, _ = load_model_and_tokenizer(ModelConfig(tiny=small, dtype="bfloat16"), corpus=TEXTS)
    assert next(m.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer(ModelConfig(tiny=small, dtype="float7"), corpus=TEXTS)


@pytest.mark.parametrize("rslora", [False, True])
def test_merge_lora_state_equals_peft_merge_and_unload(tok, rslora):
    import copy

    base = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    plain_keys = set(base.state_dict())
    lora_cfg = LoraConfig(enabled=True, r=4, alpha=12, use_rslora=rslora,
                          target_modules=["q_proj", "v_proj", "down_proj"])
    model = apply_lora(copy.deepcopy(base), lora_cfg)
    if rslora:  # apply_lora passes the option through to PEFT
        assert model.peft_config["default"].use_rslora
    assert lora_scaling(lora_cfg) == pytest.approx(12 / 2.0 if rslora else 12 / 4)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B starts at zero: give every adapter a real update
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    merged = merge_lora_state(model.state_dict(), lora_scaling(lora_cfg))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(expected) == plain_keys
    for k in expected:
        assert torch.allclose(merged[k], expected[k], atol=1e-6), k
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[q], base.state_dict()[q])  # the adapters did change the weight
    # The merged weights in the plain model compute what the adapter model computes.
    base.load_state_dict(merged)
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(base(ids).logits, model(ids).logits, atol=1e-5)
    # Without LoRA keys nothing changes.
    assert merge_lora_state(expected, 2.0).keys() == expected.keys()


def test_merge_lora_state_names_a_broken_adapter(tok):
    sd = {"base_model.model.m.q.base_layer.weight": torch.zeros(2, 2), "base_model.model.m.q.lora_A.default.weight":
          torch.zeros(1, 2)}
    with pytest.raises(ValueError, match=r"'base_model.model.m.q' has lora_A but not both"):
        merge_lora_state(sd, 1.0)
    with pytest.raises(ValueError, match="model.lora.r must be >= 1, got 0"):
        lora_scaling(LoraConfig(r=0))


def test_cudnn_attention_is_turned_off_for_a_cuda_device_only():
    """cuDNN's attention builds a plan per new sequence shape (3.5x slower first generate on an H200): a CUDA
    worker or engine turns it off, a CPU one leaves torch as it was."""
    import torch

    from openmanus_rl_core.models.loading import avoid_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        avoid_cudnn_attention("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        avoid_cudnn_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
