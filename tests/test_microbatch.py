"""Micro-batches by a token budget and the sharding choices: the update and the log-probs they give equal the
padded, unsplit path's on a batch with very uneven row lengths, and a slip in the token weighting or the row order
shows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from openmanus_rl_core.workers import base as worker_base
from openmanus_rl_core.workers import microbatch
from openmanus_rl_core.workers.microbatch import plan_micro_batches, row_extents, trim_columns

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from uneven_update import flat_params, one_rank_worker, save_small_model, sgd_like_overrides, uneven_batch  # noqa: E402
from uneven_update import main as uneven_update  # noqa: E402

METRICS = ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm")


# ------------------------------------------------------------------------------------------------- the plan
def test_a_token_budget_plan_holds_every_row_once_within_the_budget_longest_first():
    rng = np.random.default_rng(0)
    prompt, resp = rng.integers(2, 200, 64), rng.integers(1, 300, 64)
    index = plan_micro_batches(prompt, resp, max_tokens=1200, max_rows=None)
    assert sorted(i for part in index for i in part) == list(range(64))
    for part in index:
        cost = len(part) * (prompt[part].max() + resp[part].max())
        assert cost <= 1200 or len(part) == 1, (part, cost)
    totals = [(prompt + resp)[part] for part in index]
    assert all(a.min() >= b.max() for a, b in zip(totals, totals[1:]))  # buckets of similar length, longest first
    assert len(index) < 64 and max(len(p) for p in index) > 4  # short rows share a micro-batch
    # The padded size of the plan is far below one padded batch of all rows.
    assert sum(len(p) * (prompt[p].max() + resp[p].max()) for p in index) < 0.75 * 64 * (prompt.max() + resp.max())


def test_the_plan_makes_exactly_the_parts_the_other_ranks_need_and_honours_the_row_cap():
    rng = np.random.default_rng(1)
    prompt, resp = rng.integers(2, 50, 20), rng.integers(1, 50, 20)
    own = plan_micro_batches(prompt, resp, max_tokens=10_000, max_rows=None)
    assert len(own) == 1
    for k in (2, 5, 20):
        index = plan_micro_batches(prompt, resp, max_tokens=10_000, max_rows=None, num_parts=k)
        assert len(index) == k and sorted(i for p in index for i in p) == list(range(20))
    assert max(len(p) for p in plan_micro_batches(prompt, resp, 10_000, max_rows=3)) == 3
    # No budget: rows in their order, micro_batch_size rows each (the old behaviour).
    assert plan_micro_batches(prompt, resp, None, 8) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]


def test_trimming_cuts_only_columns_that_are_padding_in_every_row():
    batch = uneven_batch(vocab=50, rows=6)
    assert trim_columns(batch)[0]["input_ids"].shape == batch["input_ids"].shape  # the whole batch: nothing to cut
    part = batch[[2, 3, 4]]
    small, R = trim_columns(part)
    prompt, resp = row_extents(part)
    P = part["input_ids"].shape[1] - R
    assert small["input_ids"].shape[1] == prompt.max() + resp.max()
    assert small["responses"].shape[1] == resp.max()
    assert int(small["attention_mask"].sum()) == int(part["attention_mask"].sum())  # no real token lost
    assert torch.equal(small["input_ids"][:, -resp.max():], part["input_ids"][:, P:P + resp.max()])


# --------------------------------------------------------------------------------------- one rank, in process
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def group(dist_group):
    return dist_group


_worker = one_rank_worker


@pytest.fixture(scope="module")
def batch(model_dir, group):
    """The uneven batch with old log-probs near the current ones (so the PPO clip acts on some tokens)."""
    w = _worker(model_dir, group, "actor.sharding=full")
    b = uneven_batch(len(w.tokenizer), rows=16, pad=w.tokenizer.pad_token_id)
    now = w.compute_log_probs(b, with_ref=False)["old_log_probs"]
    b["old_log_probs"] = (now + 0.3 * torch.randn(now.shape, generator=torch.Generator().manual_seed(5))) \
        * b["response_mask"]
    return b


BUDGET = ("actor.max_tokens_per_micro_batch=300", "actor.log_prob_max_tokens_per_micro_batch=300")


def _update(model_dir, group, batch, *overrides):
    w = _worker(model_dir, group, *overrides)
    before = flat_params(w)
    metrics = w.update(batch, step=1)
    return flat_params(w) - before, metrics, w


def _max_update_gap(model_dir, group, batch, *extra) -> tuple[float, float]:
    """Largest difference between the padded path (one micro-batch, FSDP2 full shard) and the token-budget path
    (bucketed micro-batches, replicate): in the parameter change (= the gradient), and in any metric."""
    padded, m_pad, _ = _update(model_dir, group, batch, "actor.sharding=full")
    split, m_split, w = _update(model_dir, group, batch, "actor.sharding=replicate", *BUDGET, *extra)
    index = w._micro_index(batch, None, 300)
    assert len(index) >= 4 and [i for p in index for i in p] != list(range(len(batch)))  # split and reordered
    assert float(padded.abs().max()) > 1e-3
    return float((split - padded).abs().max()), max(abs(m_split[k] - m_pad[k]) for k in METRICS)


def test_the_token_budget_update_equals_the_padded_one_on_very_uneven_rows(model_dir, group, batch):
    grad_gap, metric_gap = _max_update_gap(model_dir, group, batch)
    assert grad_gap < 1e-5 and metric_gap < 1e-5, (grad_gap, metric_gap)


def test_the_packed_token_budget_update_equals_the_padded_one_on_very_uneven_rows(model_dir, group, batch):
    grad_gap, metric_gap = _max_update_gap(model_dir, group, batch, "actor.pack_rows=true")
    assert grad_gap < 1e-5 and metric_gap < 1e-5, (grad_gap, metric_gap)


def test_a_slip_in_the_token_weighting_fails_the_equality(model_dir, group, batch, monkeypatch):
    monkeypatch.setattr(worker_base, "token_share", lambda part, tokens: len(part) / 16)  # rows' share, not tokens'
    grad_gap, metric_gap = _max_update_gap(model_dir, group, batch)
    assert grad_gap > 1e-4 and metric_gap > 1e-4, (grad_gap, metric_gap)


def _logprob_gap(model_dir, group, batch, *extra) -> float:
    padded = _worker(model_dir, group, "actor.sharding=full").compute_log_probs(batch, with_ref=False)
    split = _worker(model_dir, group, *BUDGET, *extra).compute_log_probs(batch, with_ref=False)
    a, b = padded["old_log_probs"], split["old_log_probs"]
    assert a.shape == b.shape == batch["responses"].shape
    R = batch["responses"].shape[1]
    real = batch["attention_mask"][:, -R:].bool()
    assert float(a[~real].abs().max()) == 0.0  # padding reads 0
    return float((a - b).abs().max())  # on real tokens and on padding


@pytest.mark.parametrize("extra", [(), ("actor.pack_rows=true",)], ids=["bucketed", "packed"])
def test_log_probs_come_back_in_the_original_row_order_and_layout(model_dir, group, batch, extra):
    assert _logprob_gap(model_dir, group, batch, *extra) < 1e-5


def test_a_row_put_back_in_the_wrong_order_fails_the_log_prob_equality(model_dir, group, batch, monkeypatch):
    monkeypatch.setattr(microbatch, "restore_rows", lambda parts, index: torch.cat(parts))
    assert _logprob_gap(model_dir, group, batch) > 0.1


@pytest.mark.parametrize("extra", [(), ("actor.pack_rows=true",)], ids=["bucketed", "packed"])
def test_a_micro_batch_of_rows_with_no_tokens_gives_zero_log_probs_and_moves_nothing(model_dir, group, batch, extra):
    """What a failed reset leaves: rows with no prompt and no response, all padding. A micro-batch of only such
    rows (one rank's shard after a server died) must run, read 0 and add no gradient."""
    w = _worker(model_dir, group, "actor.sharding=replicate", *BUDGET, *extra)
    empty = batch[[0, 1, 2, 3]]
    for k in ("attention_mask", "response_mask", "advantages", "old_log_probs"):
        empty[k] = torch.zeros_like(empty[k])
    assert trim_columns(empty)[0]["input_ids"].shape[1] == 2  # one prompt column kept, one response column
    logp = w.compute_log_probs(empty, with_ref=False)["old_log_probs"]
    assert logp.shape == empty["responses"].shape and float(logp.abs().max()) == 0.0
    before = flat_params(w)
    w.update(empty, step=1)
    assert float((flat_params(w) - before).abs().max()) == 0.0


# ---------------------------------------------------------------------------------------------- sharding
def test_auto_sharding_replicates_a_model_that_fits_and_shards_one_that_does_not():
    from openmanus_rl_core.distributed.fsdp import choose_sharding

    model = torch.nn.Linear(1000, 1000)  # 4 MB of parameters, a replica's state 16 MB
    MB = 2 ** 20
    assert choose_sharding("auto", model, torch.device("cpu"), 2, None, memory_bytes=256 * MB)[0].name == "replicate"
    assert choose_sharding("auto", model, torch.device("cpu"), 2, None, memory_bytes=48 * MB)[0].name == "grad_op"
    assert choose_sharding("auto", model, torch.device("cpu"), 2, None, memory_bytes=16 * MB)[0].name == "full"
    assert choose_sharding("auto", model, torch.device("cpu"), 2, "bf16", memory_bytes=256 * MB)[0].name == "grad_op"
    assert choose_sharding("grad_op", model, torch.device("cpu"), 2, None)[0].name == "grad_op"


def test_the_sharding_choices_give_the_same_update_on_two_ranks(model_dir, tmp_path):
    """Two gloo ranks, the token-budget micro-batches (several per step, so gradients accumulate), one update, then
    the weight sync into each rank's engine."""
    uneven_update([model_dir, str(tmp_path), "2", "full,grad_op,replicate", "actor.max_tokens_per_micro_batch=300"],
                  timeout_s=300)  # two rank processes started from this one
    results = {name: torch.load(tmp_path / f"{name}.pt") for name in ("full", "grad_op", "replicate")}
    for name, result in results.items():
        assert result["sharding"].startswith(name)
    full = results["full"]
    assert float(full["delta"].abs().max()) > 1e-3
    for name in results:  # the weight sync: each rank's engine holds the trained weights, exactly
        assert [torch.load(tmp_path / f"{name}-engine-gap-{rank}.pt") for rank in (0, 1)] == [0.0, 0.0], name
    for name in ("grad_op", "replicate"):
        gap = float((results[name]["delta"] - full["delta"]).abs().max())
        assert gap < 1e-5, (name, gap)
        for k in METRICS:
            assert results[name]["metrics"][k] == pytest.approx(full["metrics"][k], abs=1e-5), (name, k)


def test_critic_values_and_update_under_a_token_budget_equal_the_padded_ones(model_dir, group, batch):
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.workers import CriticWorker

    def critic(*overrides):
        cfg = load(sgd_like_overrides() + ["algorithm.adv_estimator=gae", "algorithm.use_critic=true",
                                           "critic.lr=1e4", "critic.eps=1e4", "critic.grad_clip=0", *overrides],
                   training=False)
        w = CriticWorker(cfg, rank=0, world_size=1, model_dir=model_dir, total_steps=10)
        w.setup(*group)
        return w

    b = batch.select(["input_ids", "attention_mask", "position_ids", "responses", "response_mask"])
    g = torch.Generator().manual_seed(7)
    b["values"] = 0.1 * torch.randn(b["response_mask"].shape, generator=g) * b["response_mask"]
    b["returns"] = torch.randn(b["response_mask"].shape, generator=g) * b["response_mask"]
    padded, split = critic("critic.sharding=full"), critic("critic.max_tokens_per_micro_batch=300")
    deltas = []  # the value head starts at 0: the values are compared after the update
    for w in (padded, split):
        before = flat_params(w)
        w.update(b, step=1)
        deltas.append(flat_params(w) - before)
    assert float(deltas[0].abs().max()) > 1e-3
    assert float((deltas[1] - deltas[0]).abs().max()) < 1e-5
    after_pad, after_split = padded.compute_values(b), split.compute_values(b)
    assert float(after_pad.abs().max()) > 1e-3
    assert float((after_split - after_pad).abs().max()) < 1e-5


def test_replicate_with_mixed_precision_is_refused_naming_the_key():
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.loading import load

    with pytest.raises(ConfigError, match="actor.sharding=replicate: trainer.mixed_precision=bf16"):
        load(["actor.sharding=replicate", "trainer.mixed_precision=bf16"])
