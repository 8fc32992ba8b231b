"""The update overlapping the rollout (``rollout.overlap_update``, openmanus_rl_core/run/overlap.py): chunked gradients
equal the whole batch's update, on one rank and on two; the stream hands every group over once, whole, before the
batch returns; the settings it cannot work with are refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.distributed.sharding import shard_batch
from openmanus_rl_core.rollout.stream import GroupStream
from openmanus_rl_core.config.schema import RolloutConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_stream import SimActor, _tasks  # noqa: E402
from uneven_update import flat_params, one_rank_worker, save_small_model, uneven_batch  # noqa: E402
from uneven_update import main as uneven_update  # noqa: E402

METRICS = ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm")
CHUNKS = [range(0, 4), range(4, 12), range(12, 16)]  # uneven chunks of whole groups of 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def batch(model_dir, dist_group):
    """16 very uneven rows in groups of 4, old log-probs near the current ones (the PPO clip acts)."""
    w = one_rank_worker(model_dir, dist_group)
    b = uneven_batch(len(w.tokenizer), rows=16, pad=w.tokenizer.pad_token_id, group=4)
    now = w.compute_log_probs(b, with_ref=False)["old_log_probs"]
    b["old_log_probs"] = (now + 0.3 * torch.randn(now.shape, generator=torch.Generator().manual_seed(5))) \
        * b["response_mask"]
    return b


def _whole(model_dir, group, batch, *overrides):
    w = one_rank_worker(model_dir, group, *overrides)
    before = flat_params(w)
    metrics = w.update(batch, step=1)
    return flat_params(w) - before, metrics


def _chunked(model_dir, group, batch, *overrides, total=None):
    w = one_rank_worker(model_dir, group, *overrides)
    before = flat_params(w)
    tokens = [w.accumulate(batch[list(rows)]) for rows in CHUNKS]
    assert tokens == [float(batch[list(rows)]["response_mask"].sum()) for rows in CHUNKS]
    metrics = w.step_accumulated(sum(tokens) if total is None else total)
    return flat_params(w) - before, metrics


@pytest.mark.parametrize("extra", [(), ("actor.max_tokens_per_micro_batch=300",)], ids=["whole", "token-budget"])
def test_chunked_gradients_make_the_update_of_the_whole_batch(model_dir, dist_group, batch, extra):
    whole, m_whole = _whole(model_dir, dist_group, batch, *extra)
    chunked, m_chunked = _chunked(model_dir, dist_group, batch, *extra)
    assert float(whole.abs().max()) > 1e-3 and m_whole["actor/pg_clipfrac"] > 0
    assert float((chunked - whole).abs().max()) < 1e-5
    for k in METRICS:
        assert abs(m_chunked[k] - m_whole[k]) < 1e-5, k
    assert m_chunked["actor/num_updates"] == 1.0 and m_chunked["actor/skipped_updates"] == 0.0


class _OneRank:
    """The actor worker group as OverlappedUpdate calls it, over one in-process rank."""

    size = 1

    def __init__(self, worker):
        self.worker = worker

    def call_each(self, method, args):
        return [getattr(self.worker, method)(*a) for a in args]

    def call(self, method, **kw):
        return [getattr(self.worker, method)(**kw)]


@pytest.mark.parametrize("handed", [CHUNKS[:2], CHUNKS], ids=["two-chunks-then-the-rest", "every-chunk"])
def test_chunks_then_the_whole_batch_as_the_trainer_adds_them_make_one_update(model_dir, dist_group, batch,
                                                                             monkeypatch, handed):
    """The trainer's order (Trainer.phase_rollout): OverlappedUpdate.add for each chunk the stream hands over, then
    add(every episode of the batch) -- which adds only those not handed over yet -- then one step. The rows'
    advantages and old log-probs are the batch's own (the trainer's phases are stubbed out): the update is the one
    the whole batch makes, each row counted once."""
    from types import SimpleNamespace

    import openmanus_rl_core.rollout as rollout
    from openmanus_rl_core.run.overlap import OverlappedUpdate
    from openmanus_rl_core.run.trainer import Trainer

    whole, m_whole = _whole(model_dir, dist_group, batch)
    worker = one_rank_worker(model_dir, dist_group)
    before = flat_params(worker)
    episodes = [SimpleNamespace(row=i, trajectory=SimpleNamespace()) for i in range(len(batch))]
    monkeypatch.setattr(rollout, "build_batch", lambda eps, *_: batch[[e.row for e in eps]])
    trainer = SimpleNamespace(
        actor=_OneRank(worker), allocator=None, pad_token_id=worker.tokenizer.pad_token_id,
        cfg=SimpleNamespace(rollout=SimpleNamespace(keep_env_errors=False)),
        composer=SimpleNamespace(compose_batch=lambda trajs: ([SimpleNamespace(total=0.0) for _ in trajs], {})),
        phase_log_probs=lambda b, m: None, phase_advantages=lambda b, m: None, correction="behaviour")
    overlap = OverlappedUpdate(trainer)
    for rows in handed:
        overlap.add([episodes[i] for i in rows])
    overlap.add(episodes)
    (m_chunked,) = overlap.step()
    chunked = flat_params(worker) - before
    assert float((chunked - whole).abs().max()) < 1e-5
    for k in METRICS:
        assert abs(m_chunked[k] - m_whole[k]) < 1e-5, k
    assert m_chunked["actor/num_updates"] == 1.0
    assert overlap.chunks == 3 and overlap.tokens == float(batch["response_mask"].sum())
    assert len(overlap.breakdowns(episodes)) == len(batch)


def test_dividing_by_other_than_the_batch_tokens_moves_the_update(model_dir, dist_group, batch):
    whole, _ = _whole(model_dir, dist_group, batch)
    tokens = float(batch["response_mask"].sum())
    off, _ = _chunked(model_dir, dist_group, batch, total=tokens * 1.25)
    assert float((off - whole * 0.8).abs().max()) < 1e-5  # the SGD-like step scales with the gradient
    assert float((off - whole).abs().max()) > 1e-4


def test_a_step_without_chunks_is_refused(model_dir, dist_group):
    w = one_rank_worker(model_dir, dist_group)
    with pytest.raises(RuntimeError, match="before any of its chunks"):
        w.step_accumulated(10.0)


def test_two_ranks_chunked_make_the_one_rank_update_of_the_whole_batch(model_dir, dist_group, tmp_path):
    """Each chunk split between two ranks as the trainer does (shard_batch), then one step: the update is the
    batch's token mean, the same as one rank on the whole batch (a missing world-size factor halves it)."""
    w = one_rank_worker(model_dir, dist_group)
    same = uneven_batch(len(w.tokenizer), pad=w.tokenizer.pad_token_id, group=4)  # uneven_update.py's batch
    whole, _ = _whole(model_dir, dist_group, same)
    uneven_update([model_dir, str(tmp_path), "2", "replicate,full", "--group", "4", "--chunks", "0,4,12"],
                  timeout_s=600)  # two rank processes started from this one
    for choice in ("replicate", "full"):
        got = torch.load(tmp_path / f"{choice}.pt")
        assert float((got["delta"] - whole).abs().max()) < 1e-5, choice


# ------------------------------------------------------------------------------------------------ the stream
def test_the_stream_hands_each_group_over_once_whole_before_the_batch_returns():
    actor = SimActor(seed=7)
    stream = GroupStream(actor, RolloutConfig(n=3, max_staleness=0), _tasks, 4)
    for v in range(5):
        handed: list[list] = []
        eps = stream.next_batch(v, {}, on_groups=handed.append)
        flat = [e for chunk in handed for e in chunk]
        assert sorted(map(id, flat)) == sorted(map(id, eps))  # every trained episode, once
        for chunk in handed:  # whole groups only
            gids = [e.group_id for e in chunk]
            assert all(gids.count(g) == 3 for g in set(gids))
        assert len(handed) >= 2  # groups came in while others still played
        actor.advance(2)
        actor.version = v + 1


def test_groups_are_handed_over_only_in_the_batchs_tail():
    """Gradients computed beside generation only slow it: a group is handed over once at most
    HANDOVER_RUNNING_SHARE of the batch's 8 groups still play, and some are handed over while the last ones still
    play."""
    from openmanus_rl_core.rollout.stream import HANDOVER_RUNNING_SHARE

    stream = GroupStream(SimActor(seed=3), RolloutConfig(n=3, max_staleness=0), _tasks, 8)
    running_at_handover: list[int] = []
    for v in range(6):
        stream.next_batch(v, {}, on_groups=lambda eps: running_at_handover.append(len(stream.running)))
        stream.actor.version = v + 1
    assert running_at_handover and max(running_at_handover) <= HANDOVER_RUNNING_SHARE * 8, running_at_handover
    assert any(n > 0 for n in running_at_handover), running_at_handover


def test_the_stream_refuses_to_hand_groups_over_above_eta_0():
    stream = GroupStream(SimActor(seed=1), RolloutConfig(n=2, max_staleness=1), _tasks, 4)
    with pytest.raises(ValueError, match="max_staleness=0, not 1"):
        stream.next_batch(0, {}, on_groups=lambda eps: None)


@pytest.mark.parametrize("override,named", [
    ("rollout.max_staleness=1", "rollout.max_staleness=1"),
    ("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.adv_estimator=reinforce_plus_plus"),
    ("actor.ppo_epochs=2", "actor.ppo_epochs=2"),
    ("algorithm.use_kl_loss=true", "use_kl_loss=True"),
])
def test_settings_the_overlapped_update_cannot_follow_are_refused_by_name(override, named):
    base = ["rollout.overlap_update=true", "rollout.max_staleness=0"]
    load(base)  # the base itself is fine
    with pytest.raises(ConfigError, match=named.replace("+", r"\+")) as err:
        load([*base, override])
    assert "rollout.overlap_update=true" in str(err.value)


# ------------------------------------------------------------------------------------------------ a real run
@pytest.mark.slow
def test_a_run_with_the_overlapped_update_trains_one_step_per_batch(tmp_path, ray_local, command_here):
    """``openmanus-rl train`` (its function, cli.main, in this process on the tests' shared Ray) on key_door behind
    a latency env, the stream at eta=0 with the update overlapped: every step trains its B groups, on-policy
    (staleness 0), with one optimizer step whose gradient came in chunks while the batch still played."""
    import json
    import math

    from test_trainer import _overrides

    run = tmp_path / "run"
    out = command_here(["train", *_overrides(run, ["env=latency", "env.kwargs.median_ms=5", "rollout.max_staleness=0",
                                                   "rollout.overlap_update=true", "trainer.total_steps=3",
                                                   "trainer.save_freq=0"])])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["stream/groups"] == 4 and r["stream/staleness_max"] == 0
        assert r["stream/overlap_chunks"] >= 1 and r["timing/overlap_update"] > 0
        assert r["actor/num_updates"] == 1 and r["actor/skipped_updates"] == 0
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
