"""Tiny Hugging Face model folders of two families, built locally (no hub): a Llama-style one (``nn.Linear``
layers) and a GPT-2-style one (``Conv1D`` layers, weights stored transposed), each with a byte-level BPE trained
on a few texts and the ChatML template."""

from __future__ import annotations

from pathlib import Path

TEXTS = ["You are in a room. There is a key and a door.", "<action>take key</action>", "<action>open door</action>",
         "The door is open. You win."] * 4 + [f"room {i} has a box" for i in range(30)]


def save_tiny(family: str, folder: Path, chat_template: bool = True, seed: int = 0) -> Path:
    """Write a randomly initialised ``family`` ("llama" or "gpt2") model and its tokenizer into ``folder``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from openmanus_rl_core.models.loading import build_tokenizer

    tok = build_tokenizer(TEXTS, vocab_size=400)
    ids = dict(bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if family == "llama":
        config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                             tie_word_embeddings=True, **ids)
        cls = LlamaForCausalLM
    else:
        config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=32, n_layer=1, n_head=2, **ids)
        cls = GPT2LMHeadModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    if not chat_template:
        tok.chat_template = None
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder
