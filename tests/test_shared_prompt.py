"""Shared prompts (openmanus_rl_core/models/shared_prompt.py): a prompt several rows share runs once, in the engine's
prefill and in the actor's log-probs and update, and the results equal those of the rows run one by one; a slip
in which rows share which prompt shows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from openmanus_rl_core.models import shared_prompt
from openmanus_rl_core.engines import hf as hf_engine
from openmanus_rl_core.models.shared_prompt import shared_prefixes

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from uneven_update import flat_params, one_rank_worker, save_small_model, start_alike, uneven_batch  # noqa: E402
from uneven_update import main as uneven_update  # noqa: E402

METRICS = ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm")


def test_shared_prefixes_split_the_rows_where_that_saves_the_most_tokens():
    system, task_a, task_b = [7] * 10, [1, 2, 3, 4], [5, 9, 9, 9]
    rows = [system + task_a + [5, 6], [3, 3, 3], system + task_b + [8], system + task_a + [6],
            system + task_a + [5, 6], system + task_b + [8, 8, 8]]
    first, which, length = shared_prefixes(rows)
    # The three task_a rows share 14 tokens (system + task_a); the two task_b rows have 15 in common, but one token
    # of each row is always left and row 2 has 15, so they share 14; [3, 3, 3] shares nothing. Splitting by task
    # saves 14*2 + 14 = 42 tokens, against 10*4 = 40 for one prefix of the system prompt over all five.
    groups = {tuple(sorted(b for b, u in enumerate(which) if u == k)): length[k] for k in range(len(first))}
    assert groups == {(0, 3, 4): 14, (2, 5): 14}
    assert which[1] == -1 and all(which[f] == k for k, f in enumerate(first))
    # A GRPO group: the whole prompt but its last token.
    assert shared_prefixes([[4, 5, 6]] * 4) == ([0], [0, 0, 0, 0], [2])
    assert shared_prefixes([[1, 2], [2, 1], [3, 3]]) is None  # nothing shared
    assert shared_prefixes([[1] + [2] * 19, [1] + [3] * 19]) is None  # 1 token of 40: under a tenth
    assert shared_prefixes([[1, 2, 3]]) is None


# --------------------------------------------------------------------------------------- the actor, in process
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("model"))


_worker = one_rank_worker


@pytest.fixture(scope="module")
def batch(model_dir, dist_group):
    """16 rows of very uneven lengths in 4 groups of 4 that share a prompt, with old log-probs near the current
    ones (so the PPO clip acts on some tokens)."""
    w = _worker(model_dir, dist_group, "actor.share_prompts=false")
    b = uneven_batch(len(w.tokenizer), rows=16, pad=w.tokenizer.pad_token_id, group=4)
    now = w.compute_log_probs(b, with_ref=False)["old_log_probs"]
    b["old_log_probs"] = (now + 0.3 * torch.randn(now.shape, generator=torch.Generator().manual_seed(5))) \
        * b["response_mask"]
    return b


def _rows_per_forward(model) -> list[int]:
    """Record the batch size of every forward pass of ``model`` (a list that fills as it runs)."""
    seen: list[int] = []
    model.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                    with_kwargs=True)
    return seen


def _gaps(model_dir, dist_group, batch, *extra) -> tuple[float, float, float, list[int]]:
    """(log-prob gap, parameter-change gap, metric gap, rows per forward pass of the shared run) between
    ``actor.share_prompts=false`` and ``true``, both with ``extra``."""
    out = []
    for share in ("false", "true"):
        w = _worker(model_dir, dist_group, f"actor.share_prompts={share}", *extra)
        rows = _rows_per_forward(w.model)
        logp = w.compute_log_probs(batch, with_ref=False)["old_log_probs"]
        before = flat_params(w)
        metrics = w.update(batch, step=1)
        out.append((logp, flat_params(w) - before, metrics, rows))
    (lp0, d0, m0, _), (lp1, d1, m1, rows) = out
    assert float(d0.abs().max()) > 1e-3 and lp0.shape == batch["responses"].shape
    return (float((lp1 - lp0).abs().max()), float((d1 - d0).abs().max()),
            max(abs(m1[k] - m0[k]) for k in METRICS), rows)


def test_the_shared_prompt_log_probs_and_update_equal_the_rows_run_one_by_one(model_dir, dist_group, batch):
    logp_gap, grad_gap, metric_gap, rows = _gaps(model_dir, dist_group, batch)
    assert logp_gap < 1e-5 and grad_gap < 1e-5 and metric_gap < 1e-5, (logp_gap, grad_gap, metric_gap)
    # Each pass (the old log-probs, then the update) runs the 4 distinct prompts, then the 16 responses.
    assert rows == [4, 16, 4, 16]


def test_shared_prompts_under_a_token_budget_equal_the_rows_run_one_by_one(model_dir, dist_group, batch):
    """Rows sorted by length split the groups across micro-batches: what is shared is shared within each."""
    budget = ("actor.max_tokens_per_micro_batch=300", "actor.log_prob_max_tokens_per_micro_batch=300")
    logp_gap, grad_gap, metric_gap, rows = _gaps(model_dir, dist_group, batch, *budget)
    assert logp_gap < 1e-5 and grad_gap < 1e-5 and metric_gap < 1e-5, (logp_gap, grad_gap, metric_gap)
    assert len(rows) > 4  # several micro-batches


@pytest.fixture(scope="module")
def turns_batch(model_dir, dist_group):
    """Per-turn samples: 16 uneven rows whose prompts start alike (uneven_update.start_alike)."""
    w = _worker(model_dir, dist_group, "actor.share_prompts=false")
    b = uneven_batch(len(w.tokenizer), rows=16, pad=w.tokenizer.pad_token_id)
    return start_alike(b, len(w.tokenizer))


def test_per_turn_prompts_that_start_alike_share_that_start(model_dir, dist_group, turns_batch):
    found = shared_prompt.shared_prefixes([r[m.bool()].tolist() for r, m in zip(
        turns_batch["input_ids"][:, :48], turns_batch["attention_mask"][:, :48])])
    assert found is not None and sorted(found[2]) != [min(found[2])] * len(found[2])  # prefixes of several lengths
    logp_gap, grad_gap, metric_gap, rows = _gaps(model_dir, dist_group, turns_batch)
    assert logp_gap < 1e-5 and grad_gap < 1e-5 and metric_gap < 1e-5, (logp_gap, grad_gap, metric_gap)
    assert rows == [len(found[0]), 16] * 2


@pytest.mark.parametrize("slip", ["next prefix", "one token longer"])
def test_a_row_given_a_wrong_prefix_fails_the_equality(model_dir, dist_group, turns_batch, monkeypatch, slip):
    right = shared_prompt.shared_prefixes

    def slipped(rows):
        first, which, length = right(rows)
        if slip == "next prefix":  # every sharing row reads the next prefix
            which = [(u + 1) % len(first) if u >= 0 else u for u in which]
        else:  # each prefix takes one more token of its first row
            length = [n + 1 for n in length]
        return first, which, length

    monkeypatch.setattr(shared_prompt, "shared_prefixes", slipped)
    logp_gap, grad_gap, metric_gap, _ = _gaps(model_dir, dist_group, turns_batch)
    assert logp_gap > 1e-3 and grad_gap > 1e-4 and metric_gap > 1e-4, (logp_gap, grad_gap, metric_gap)


# make test runs GRPO groups; per-turn layouts take the same sharded path (make test-long), and their sharing is
# checked on one rank above
@pytest.mark.parametrize("rows", [["--group", "4"], pytest.param(["--turns"], marks=pytest.mark.long)],
                         ids=["groups", "turns"])
def test_the_sharding_choices_with_shared_prompts_equal_the_rows_run_one_by_one(model_dir, tmp_path, rows):
    """Two gloo ranks: FSDP2 full shard runs the prefixes and the rests as two forward passes before one backward.
    Both choices with shared prompts against the update of the same rows run one by one; GRPO groups, and
    per-turn samples whose prompts start alike."""
    def launch(name: str, *extra: str) -> dict:
        out = tmp_path / name
        out.mkdir()
        uneven_update([model_dir, str(out), "2", "full,replicate", *rows, *extra], timeout_s=300)  # two ranks
        return {choice: torch.load(out / f"{choice}.pt") for choice in ("full", "replicate")}

    reference = launch("alone", "actor.share_prompts=false")["full"]
    assert float(reference["delta"].abs().max()) > 1e-3
    for name, result in launch("shared").items():
        assert result["sharding"].startswith(name)
        gap = float((result["delta"] - reference["delta"]).abs().max())
        assert gap < 1e-5, (name, gap)
        for k in METRICS:
            assert result["metrics"][k] == pytest.approx(reference["metrics"][k], abs=1e-5), (name, k)


# ------------------------------------------------------------------------------------------------- the engine
@pytest.mark.parametrize("case", ["groups", "turns"])
def test_the_engine_prefills_each_shared_start_once_and_samples_the_same(model_dir, monkeypatch, case):
    """``groups``: two prompts, 3 and 5 samples each. ``turns``: 8 prompts that start with the same system prompt
    and task, then differ (per-turn prompts), and one that shares nothing."""
    from openmanus_rl_core.models.loading import load_model_and_tokenizer
    from openmanus_rl_core.protocols import SamplingParams
    from openmanus_rl_core.config.schema import ModelConfig

    model, tok = load_model_and_tokenizer(ModelConfig(path=model_dir), [])
    if case == "groups":
        prompts = [tok("Say: apple")["input_ids"]] * 3 + [tok("Say: bird, then apple")["input_ids"]] * 5
    else:
        start = tok("Say: bird, then apple, then bird, then apple")["input_ids"]
        prompts = [start + tok(" bird" * k)["input_ids"] for k in range(8)] + [tok("apple")["input_ids"]]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0)

    def run():
        engine = hf_engine.HFEngine(model, tok, seed=11)
        rows = _rows_per_forward(engine.model)
        gens = engine.generate(prompts, params)
        return gens, rows[:2]  # the prefill's passes

    shared, rows = run()
    assert rows == ([2, 8] if case == "groups" else [1, 9])
    monkeypatch.setattr(shared_prompt, "shared_prefixes", lambda rows: None)
    alone, rows = run()
    assert rows[0] == len(prompts)
    assert [g.token_ids for g in shared] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in shared}) > 2  # the samples differ
    gap = max(abs(a - b) for g, h in zip(shared, alone) for a, b in zip(g.logprobs, h.logprobs))
    assert gap < 1e-5
