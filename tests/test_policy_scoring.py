"""The policy as a scorer of given replies (models/scoring.py), and the ``openmanus_rl_policy_metrics`` hook that
receives it: log-probabilities equal to one unpadded forward pass per row whatever the batch, and a plugin's
metrics reaching eval's result (and validation's, through the same hook)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from openmanus_rl_core.commands.eval import _policy_metrics
from openmanus_rl_core.hookspecs import hookimpl
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.models.scoring import PolicyScorer, continuation_logprobs
from openmanus_rl_core.plugin.manager import make_plugin_manager

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = build_tokenizer(["a policy scores the replies it is given, token by token"] * 4, vocab_size=300)
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, seed=5), tokenizer


def test_continuation_logprobs_equal_one_forward_per_row_whatever_the_padding(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    prompts = [enc("a policy scores"), enc("the replies it is given, token"), enc("a")]
    conts = [enc(" the replies"), enc(" by token"), []]
    got = continuation_logprobs(model, prompts, conts, tokenizer.pad_token_id, batch_rows=2)
    for p, c, value in zip(prompts, conts, got):
        if not c:
            assert value == 0.0
            continue
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([p + c])).logits[0].float(), -1)
        assert value == pytest.approx(sum(float(lp[len(p) - 1 + i, t]) for i, t in enumerate(c)), abs=1e-4)
        assert value < 0
    with pytest.raises(ValueError, match="2 prompts for 1 continuations"):
        continuation_logprobs(model, prompts[:2], conts[:1], tokenizer.pad_token_id)


class Measure:
    """A policy-metrics plugin: the probability of one reply after one prompt."""

    @hookimpl
    def openmanus_rl_policy_metrics(self, cfg, policy):
        if cfg.env.name != "measured":
            return None
        enc = lambda t: policy.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        return {"reply_logp": policy.score([enc("a policy")], [enc(" scores")])[0]}


def test_a_plugins_policy_metrics_reach_eval_through_the_hook(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Measure())
    monkeypatch.setattr("openmanus_rl_core.plugin.manager.make_plugin_manager", lambda: pm)
    cfg = SimpleNamespace(env=SimpleNamespace(name="measured", kwargs={}), rollout=SimpleNamespace(engine="hf"))
    engine = SimpleNamespace(model=model)
    expected = continuation_logprobs(model, [tokenizer.encode("a policy", add_special_tokens=False)],
                                     [tokenizer.encode(" scores", add_special_tokens=False)], tokenizer.pad_token_id)
    assert _policy_metrics(cfg, engine, tokenizer, None) == {"reply_logp": pytest.approx(expected[0])}
    other = SimpleNamespace(env=SimpleNamespace(name="other", kwargs={}), rollout=cfg.rollout)
    assert _policy_metrics(other, engine, tokenizer, None) == {}
    scorer = PolicyScorer(tokenizer, None, lambda p, c: [0.0] * len(p))
    assert pm.hook.openmanus_rl_policy_metrics(cfg=cfg, policy=scorer) == [{"reply_logp": 0.0}]
    served = SimpleNamespace()  # an engine without a model here: the plugin's score call raises LookupError
    with pytest.raises(LookupError, match="holds no model here"):
        _policy_metrics(cfg, served, tokenizer, None)
