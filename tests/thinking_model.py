"""A tiny model with a thinking model's chat template: earlier ``<think>`` blocks are dropped when a conversation is
rendered, so a whole episode's tokens cannot be re-rendered token for token (per-turn samples must be used).

The model is taught in a few seconds of supervised steps to reply ``<think>...</think><action>say <word></action>``,
so its replies really carry reasoning blocks for the template to drop.

Run as a script (``python tests/thinking_model.py OUT_DIR``) it saves the model and tokenizer to ``OUT_DIR``.
"""

from __future__ import annotations

import sys

# Qwen3-style: an assistant message keeps only what follows its last </think> (the reasoning of past turns is gone).
THINK_DROPPING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip() %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

THOUGHT = "the sign shows a word"


def relay_env(length: int = 8):
    from openmanus_rl_env_text.relay import RelayEnv

    return RelayEnv(length=length, padding=1, num_tasks=100)


def build(steps: int = 60, seed: int = 0):
    """``(model, tokenizer)``: tokenizer trained on relay episodes with the think-dropping template, model taught
    to open each reply with a think block."""
    import torch

    from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
    from openmanus_rl_core.plugin.registry import build as build_component
    from openmanus_rl_core.rollout import tokenizer_corpus

    template = build_component("template", {"name": "react", "kwargs": {"think": True}})
    corpus = tokenizer_corpus(relay_env, template, [{"task_id": i, "seed": 0} for i in range(8)])
    corpus += [template.render("say apple", thought=THOUGHT)] * 4
    tok = build_tokenizer(corpus, vocab_size=400)
    tok.chat_template = THINK_DROPPING_TEMPLATE
    torch.manual_seed(seed)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             seed=seed, initializer_range=0.1)
    env = relay_env()
    obs = env.reset(task_id=0)
    prompt = tok.apply_chat_template([{"role": "system", "content": template.system_prompt(env.instruction)},
                                      {"role": "user", "content": obs}], tokenize=False, add_generation_prompt=True)
    p = tok.encode(prompt, add_special_tokens=False)
    r = tok.encode(template.render(f"say {env.oracle_action().split()[-1]}", thought=THOUGHT),
                   add_special_tokens=False) + [tok.eos_token_id]
    ids = torch.tensor([p + r])
    labels = torch.tensor([[-100] * len(p) + r])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, tok


if __name__ == "__main__":
    m, t = build()
    m.save_pretrained(sys.argv[1])
    t.save_pretrained(sys.argv[1])
