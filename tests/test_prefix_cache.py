"""The HF engine's prefix cache (openmanus_rl_core/engines/prefix_cache.py): each turn of an episode prefills only
what follows the last turn, samples what prefilling the whole prompt samples, and the cache never serves keys and
values of other weights, of another rollout or of a different sequence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.engines.prefix_cache import BLOCK, PrefixCache, _block_keys
from openmanus_rl_core.protocols import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from uneven_update import save_small_model  # noqa: E402


def _kv(n: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of ``n`` tokens whose entries are their column numbers (so a slice shows where it came from)."""
    col = torch.arange(n, dtype=torch.float32)[None, :, None].expand(1, n, 4).contiguous()
    return [(col.clone(), -col.clone()) for _ in range(layers)]


def test_a_lookup_finds_the_longest_cached_prefix_whole_blocks_first():
    cache = PrefixCache(max_bytes=1 << 20)
    a = list(range(100, 140))  # 40 tokens: 2 whole blocks and 8 more
    cache.add(a, _kv(40))
    entry, k = cache.match(a + [7, 7, 7])
    assert entry.tokens == a and k == 40
    assert cache.match(a[:37] + [1] * 10)[1] == 37  # the match ends inside the third block
    assert cache.match(a)[1] == 39  # one token is always left to prefill
    assert cache.match(a[:BLOCK - 1] + [1] * 30) == (None, 0)  # under one whole block: not looked up
    assert cache.match([1] + a) == (None, 0)
    assert (cache.hit_tokens, cache.prompt_tokens) == (40 + 37 + 39, 43 + 47 + 40 + 45 + 41)


def test_a_longer_turn_replaces_the_one_before_and_the_bytes_stay_bounded():
    per_token = 2 * 2 * 4 * 4  # layers x (keys, values) x head_dim x 4 bytes
    cache = PrefixCache(max_bytes=100 * per_token)
    turn1 = list(range(1000, 1040))
    cache.add(turn1, _kv(40))
    cache.add(turn1 + list(range(5, 25)), _kv(60))  # the same episode, one turn later
    assert len(cache) == 1 and cache.nbytes == 60 * per_token
    other = list(range(2000, 2040))
    cache.add(other, _kv(40))  # 100 tokens in all: still within the bound
    assert len(cache) == 2
    assert cache.match(turn1 + list(range(5, 25)) + [3])[1] == 60  # touched: now the most recently used
    cache.add(list(range(3000, 3020)), _kv(20))  # 120 tokens: the least recently used entry goes
    assert cache.match(other + [1])[0] is None
    assert cache.match(turn1 + [5, 6, 7])[1] == 42
    assert cache.nbytes == 80 * per_token and set(cache.index) == {
        *_block_keys(turn1 + list(range(5, 25)), 60), *_block_keys(list(range(3000, 3020)), 20)}
    cache.add(list(range(500, 700)), _kv(200))  # larger than the whole bound: not kept
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and not cache.index


def test_a_block_key_that_collides_is_not_a_hit():
    cache = PrefixCache(max_bytes=1 << 20)
    cache.add(list(range(100, 140)), _kv(40))
    other = list(range(600, 640))
    (eid,) = cache.entries
    cache.index[_block_keys(other, BLOCK)[0]] = {eid: None}  # as if the two first blocks hashed alike
    assert cache.match(other + [1]) == (None, 0)


# ------------------------------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def model_tok(tmp_path_factory):
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.config.schema import ModelConfig

    return load_model_and_tokenizer(ModelConfig(path=save_small_model(tmp_path_factory.mktemp("model"))), [])


def _turns(model, tok, mb: float, turns: int = 3, params=None, engine=None):
    """``turns`` turns of six episodes (two tasks, three samples each): each turn's prompt is the last prompt, the
    reply and an observation. Returns the engine, each turn's generations and the width of each turn's first
    forward pass (the prefill)."""
    engine = engine or HFEngine(model, tok, seed=3, prefix_cache_mb=mb)
    params = params or SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0, stop=["pp"])
    widths: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda mod, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    tasks = [tok("Say: bird, then apple, then bird, then apple, then bird " * 2)["input_ids"],
             tok("Say: apple, then apple, then bird, then bird, then apple " * 2)["input_ids"]]
    prompts = [t for t in tasks for _ in range(3)]
    out, firsts = [], []
    try:
        for turn in range(turns):
            del widths[:]
            gens = engine.generate(prompts, params)
            out.append(gens)
            firsts.append(widths[0])
            obs = [tok(f" observation {turn} {i}")["input_ids"] for i in range(len(prompts))]
            prompts = [p + g.token_ids + o for p, g, o in zip(prompts, gens, obs)]
    finally:
        hook.remove()
    return engine, out, firsts


def test_each_turn_prefills_only_what_follows_the_last_and_samples_the_same(model_tok):
    model, tok = model_tok
    cached, with_cache, widths = _turns(model, tok, mb=64)
    _, whole, whole_widths = _turns(model, tok, mb=0)
    for a, b in zip(with_cache, whole):
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        assert max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.logprobs, h.logprobs)) < 1e-5
    reasons = {g.finish_reason for gens in with_cache for g in gens}
    assert reasons == {"stop", "length"}  # rows that left the batch early were kept too
    # Turn 1 finds nothing; turns 2 and 3 prefill the last reply's last token and the observation only.
    assert widths[0] == whole_widths[0]
    for turn in (1, 2):
        longest = max(len(g.token_ids[-1:]) + len(tok(f" observation {turn - 1} {i}")["input_ids"])
                      for i, g in enumerate(with_cache[turn - 1]))
        assert widths[turn] == longest < whole_widths[turn] / 3
    pc = cached.prefix_cache
    assert len(pc) == 6 and pc.hit_tokens > 0.5 * pc.prompt_tokens  # over three turns, the first with no hit


def test_new_weights_and_a_new_rollout_empty_the_cache(model_tok):
    """Keys and values of older weights are another policy's; ``update_weights`` and ``sleep`` drop them, and
    the agent loop empties the cache when a rollout starts."""
    from openmanus_rl_core.rollout import AgentLoop

    model, tok = model_tok
    engine, _, _ = _turns(model, tok, mb=64, turns=1)
    assert len(engine.prefix_cache) == 6
    engine.update_weights(model.state_dict())
    assert len(engine.prefix_cache) == 0
    engine, _, _ = _turns(model, tok, mb=64, turns=1)
    engine.sleep()
    assert len(engine.prefix_cache) == 0
    engine, _, _ = _turns(model, tok, mb=64, turns=1)
    with pytest.raises(ValueError, match="0 turns"):
        HFEngine(model, tok, prefix_cache_mb=-1)
    loop = AgentLoop(engine, tok, None, lambda: None)
    with pytest.raises(Exception):
        loop.run([{"task_id": 0, "seed": 0}])  # no env to build: fails after the rollout started
    assert len(engine.prefix_cache) == 0
