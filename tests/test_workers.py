"""Worker-level behaviour, in this process (a one-rank gloo group, no Ray): log-prob alignment with the rollout
engine, the policy update (clipping, NaN skipping), weight sync into the engine, state round trips, the critic."""

from __future__ import annotations

import math

import pytest
import torch

from openmanus_rl_core.batch import Batch
from openmanus_rl_core.algorithms.schedules import make_lr_lambda
from openmanus_rl_core.workers import ActorWorker, CriticWorker, sequence_logprobs
from openmanus_rl_core.workers.base import _minibatches
from openmanus_rl_core.workers.critic import _value_positions


def _cfg(*overrides):
    from openmanus_rl_core.config.loading import load

    return load(["seed=3", "env=word_copy", "template=react", "rollout.max_new_tokens=8", "actor.lr=1e-2",
                 "critic.lr=1e-2", "trainer.device=cpu", *overrides], training=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from openmanus_rl_core.models.loading import load_model_and_tokenizer

    d = tmp_path_factory.mktemp("model")
    corpus = ["Say: apple", "<action>apple</action>", "Say: bird", "<action>bird</action>",
              "Reply with the word you are asked to say."] * 3
    from openmanus_rl_core.config.schema import ModelConfig, TinyModelConfig

    tiny = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=64, initializer_range=0.02)
    load_model_and_tokenizer(ModelConfig(tiny=tiny), corpus, save_dir=d)
    return str(d)


@pytest.fixture(scope="module")
def actor(model_dir, dist_group):
    w = ActorWorker(_cfg(), rank=0, world_size=1, model_dir=model_dir, total_steps=10)
    info = w.setup(*dist_group)
    assert info["params"] > 0 and info["device"] == "cpu"
    return w


def _rollout_batch(actor, tasks=8):
    from openmanus_rl_core.rollout import build_batch, expand_tasks

    eps = actor.rollout(expand_tasks([{"task_id": i, "seed": i, "group_id": f"g{i // 2}"} for i in range(tasks)], 1))
    alloc = lambda total, turns, segs, length: [0.0] * length  # noqa: E731
    return build_batch(eps, None, alloc, actor.tokenizer.pad_token_id), eps


def test_lr_schedules_warm_up_then_follow_their_shape():
    const = make_lr_lambda("constant", 10, warmup_steps=2)
    assert [const(s) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    cos = make_lr_lambda("cosine", 10, warmup_steps=0, min_lr_ratio=0.1)
    assert cos(0) == pytest.approx(1.0) and cos(10) == pytest.approx(0.1) and cos(5) == pytest.approx(0.55)
    lin = make_lr_lambda("linear", 4)
    assert [lin(s) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    with pytest.raises(ValueError, match="unknown lr schedule 'step'"):
        make_lr_lambda("step", 10)


def test_minibatches_cover_every_row_once_per_epoch_in_a_seeded_order():
    b = Batch(tensors={"x": torch.arange(10)})
    runs = [[mb["x"].tolist() for _, mb in _minibatches(b, 4, 2, True, (1, 2))] for _ in range(2)]
    assert runs[0] == runs[1]  # the same seed gives the same order
    epoch0 = sorted(sum(runs[0][:3], []))
    assert epoch0 == list(range(10)) and [len(x) for x in runs[0]] == [4, 4, 2, 4, 4, 2]


def test_training_logprobs_match_the_engine_sampling_logprobs(actor):
    batch, eps = _rollout_batch(actor)
    with torch.no_grad():
        logp, ent, _ = sequence_logprobs(actor.engine.model, batch, temperature=1.0, with_entropy=True)
    mask = batch["response_mask"].bool()
    assert mask.any()
    assert torch.allclose(logp[mask], batch["rollout_log_probs"][mask], atol=1e-4)
    assert bool((ent[mask] >= 0).all())
    # The sharded training model computes the same numbers as the engine's unsharded copy.
    out = actor.compute_log_probs(batch.select(["input_ids", "attention_mask", "position_ids", "responses",
                                                "response_mask"]))
    assert torch.allclose(out["old_log_probs"][mask], logp[mask], atol=1e-5)


def test_the_engine_sleeps_after_each_rollout_and_wakes_for_the_next(actor):
    _, eps = _rollout_batch(actor, tasks=2)
    assert actor.engine.asleep  # rollout.sleep_after_rollout defaults to true
    calls = actor.engine.calls
    _, again = _rollout_batch(actor, tasks=2)
    assert actor.engine.calls > calls and len(again) == 2 and actor.engine.asleep
    actor.cfg.rollout.sleep_after_rollout = False
    try:
        actor.engine.wake_up()
        _rollout_batch(actor, tasks=2)
        assert not actor.engine.asleep
    finally:
        actor.cfg.rollout.sleep_after_rollout = True


def _params(worker):
    return {k: v.detach().clone() for k, v in worker.engine.model.state_dict().items()}


def test_update_moves_the_policy_and_sync_pushes_it_into_the_engine(actor):
    batch, _ = _rollout_batch(actor)
    batch["advantages"] = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
    before = _params(actor)
    m = actor.update(batch, step=1)
    assert m["actor/skipped_updates"] == 0 and math.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0
    assert math.isfinite(m["actor/entropy"]) and m["actor/pg_clipfrac"] == 0.0  # on-policy: ratio 1
    assert all(torch.equal(before[k], v) for k, v in _params(actor).items())  # engine untouched until the sync
    actor.sync_rollout_weights()
    after = _params(actor)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    full = actor.get_model_state()
    for k, v in full.items():
        assert torch.equal(after[k], v), k


def _one_choice_of_two(w):
    """A rollout batch whose rows each train one position, a choice between the token sampled there and the next
    id: ``(batch, choice_ids, rows, positions, the batch's response mask)``."""
    batch, _ = _rollout_batch(w)
    first = batch["response_mask"].float().argmax(-1)  # each row's first response position
    rows = torch.arange(len(first))
    chosen = batch["responses"][rows, first]
    choices = torch.full((*batch["responses"].shape, 2), -1, dtype=torch.long)
    choices[rows, first, 0], choices[rows, first, 1] = chosen, (chosen + 1) % len(w.tokenizer)
    batch["choice_ids"] = choices
    mask = batch["response_mask"].clone()
    batch["response_mask"] = torch.zeros_like(mask)
    batch["response_mask"][rows, first] = 1.0  # only the choice is trained
    return batch, choices, rows, first, mask


def _updates_from(w, state, batch, key, coeff, metric):
    """Three updates from the same weights and optimizer moments with ``algorithm.<key> = coeff``; the first's
    ``metric``."""
    w.load_state(state["model"], state["optimizer"], state["scheduler"], state["rng"])
    setattr(w.cfg.algorithm, key, coeff)
    return [w.update(batch, step=step) for step in range(6, 9)][0][metric]


def test_the_choice_kl_brings_back_an_allowed_token_the_policy_learned_to_drop(model_dir, dist_group):
    """``algorithm.choice_kl_coeff``: a policy trained to pick the sampled token of two allowed ones, then updated
    with no advantage at all, moves back toward the reference's even choice; with the coefficient at 0 it does not.
    The logged ``actor/choice_kl`` is KL(reference || policy) over the allowed tokens."""
    from openmanus_rl_core.algorithms import choice_kl

    w = ActorWorker(_cfg("actor.lr=5e-2", "algorithm.choice_kl_coeff=1.0"), rank=0, world_size=1,
                    model_dir=model_dir, total_steps=30)
    w.setup(*dist_group)
    batch, choices, rows, first, mask = _one_choice_of_two(w)
    batch["ref_choice_log_probs"] = w.compute_log_probs(batch, with_old=False)["ref_choice_log_probs"]

    def other():  # the policy's probability of the allowed token it was not trained toward, and its KL
        with torch.no_grad():
            logp = sequence_logprobs(w.model, batch, with_choices=True)[2]
        kl = choice_kl(logp, batch["ref_choice_log_probs"], choices)[rows, first].mean()
        return float(logp[rows, first, 1].exp().mean()), float(kl)

    start = other()
    batch["advantages"] = batch["response_mask"].clone()
    w.cfg.algorithm.choice_kl_coeff = 0.0
    for step in range(1, 6):
        w.update(batch, step=step)
    dropped, state = other(), w.get_state()
    batch["advantages"] = torch.zeros_like(mask)
    logged = _updates_from(w, state, batch, "choice_kl_coeff", 0.0, "actor/choice_kl")
    held = other()
    _updates_from(w, state, batch, "choice_kl_coeff", 1.0, "actor/choice_kl")
    pulled = other()
    assert abs(start[0] - 0.5) < 0.05 and start[1] < 0.01  # the reference is this policy before training
    assert dropped[0] < 0.05 and math.isclose(logged, dropped[1], rel_tol=1e-4)
    assert held[0] < dropped[0] and pulled[0] > 0.1 and pulled[1] < 0.5 * held[1]


def test_the_all_action_loss_brings_back_a_dropped_token_whose_value_is_higher(model_dir, dist_group):
    """``algorithm.all_action_coeff``: a policy trained to pick the sampled token of two allowed ones (the other's
    probability below 0.05), then updated with no advantage and the other token valued 1 above it, takes that token
    back within three updates; with the coefficient at 0 it does not. The logged ``actor/choice_value_gap`` is the
    best token's value over the policy's mean."""
    w = ActorWorker(_cfg("actor.lr=5e-2"), rank=0, world_size=1, model_dir=model_dir, total_steps=30)
    w.setup(*dist_group)
    batch, choices, rows, first, mask = _one_choice_of_two(w)

    def other():  # the policy's probability of the allowed token it was not trained toward
        with torch.no_grad():
            logp = sequence_logprobs(w.model, batch, with_choices=True)[2]
        return float(logp[rows, first, 1].exp().mean())

    batch["advantages"] = batch["response_mask"].clone()
    for step in range(1, 6):
        w.update(batch, step=step)
    dropped, state = other(), w.get_state()
    batch["advantages"] = torch.zeros_like(mask)
    batch["choice_values"] = torch.zeros(*choices.shape)
    batch["choice_values"][rows, first, 1] = 1.0  # the dropped token is worth 1 more than the sampled one
    logged = _updates_from(w, state, batch, "all_action_coeff", 0.0, "actor/choice_value_gap")
    held = other()
    _updates_from(w, state, batch, "all_action_coeff", 1.0, "actor/choice_value_gap")
    pulled = other()
    assert dropped < 0.05 and math.isclose(logged, 1.0 - dropped, rel_tol=1e-3)
    assert held <= dropped * 1.01 and pulled > 0.1


LEAN = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]


def test_an_off_policy_update_takes_its_ratio_against_the_old_log_probs(actor):
    batch, _ = _rollout_batch(actor)
    now = actor.compute_log_probs(batch.select(LEAN), with_ref=False)["old_log_probs"]
    batch["advantages"] = batch["response_mask"].clone()  # A = +1 on every trained token
    batch["old_log_probs"] = now - 0.5  # ratio e^0.5 = 1.65 on every token: above 1 + clip_high
    m = actor.update(batch, step=3)
    # Every token clipped at 1 + clip_high: loss -(1 + clip_high), no gradient, approx_kl = mean(old - new) = -0.5.
    clip_high = actor.cfg.algorithm.loss_cfg["clip_high"]
    assert 1.0 + clip_high < math.exp(0.5)
    assert m["actor/pg_clipfrac"] == 1.0
    assert m["actor/pg_loss"] == pytest.approx(-(1.0 + clip_high), abs=1e-5)
    assert m["actor/ppo_kl"] == pytest.approx(-0.5, abs=1e-4)
    assert m["actor/grad_norm"] == 0.0


def _sgd_like(model_dir, dist_group, **actor):
    """A fresh actor whose first AdamW step is plain gradient descent with step size 1: with ``lr = eps`` far above
    every gradient entry, ``theta -= lr * g / (|g| + eps) = g / (1 + |g| / eps)``. Its parameters move by exactly
    the gradient the optimizer was given."""
    cfg = _cfg("actor.lr=1e4", "actor.eps=1e4", *(f"actor.{k}={v}" for k, v in actor.items()))
    w = ActorWorker(cfg, rank=0, world_size=1, model_dir=model_dir, total_steps=10)
    w.setup(*dist_group)
    return w


def _flat(worker) -> torch.Tensor:
    """Every trainable parameter of the (FSDP2-sharded, one-rank) training model, flattened into one vector."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten().clone()
                      for p in worker.model.parameters()])


def _update_delta(worker, batch, step=1):
    before = _flat(worker)
    metrics = worker.update(batch, step=step)
    return _flat(worker) - before, metrics


def test_gradient_clipping_scales_the_step_the_optimizer_takes(model_dir, dist_group, actor):
    batch, _ = _rollout_batch(actor)
    batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0)) \
        * batch["response_mask"]
    free, m_free = _update_delta(_sgd_like(model_dir, dist_group, grad_clip=0.0), batch)
    clipped, m_clip = _update_delta(_sgd_like(model_dir, dist_group, grad_clip=0.01), batch)
    norm = m_free["actor/grad_norm"]
    assert norm > 0.1  # far above the clip, so clipping has to act
    assert float(free.norm()) == pytest.approx(norm, rel=1e-3)  # unclipped: the step is the whole gradient
    assert m_clip["actor/grad_norm"] == pytest.approx(norm, rel=1e-5)  # the reported norm is the pre-clip one
    assert float(clipped.norm()) == pytest.approx(0.01, rel=1e-3)  # the step that was taken is the clipped one
    torch.testing.assert_close(clipped, free * (0.01 / norm), rtol=1e-3, atol=3e-7)  # same direction (to fp32 rounding)


def test_a_micro_batched_update_equals_the_unsplit_one(model_dir, dist_group, actor):
    batch, _ = _rollout_batch(actor)
    mask = batch["response_mask"].clone()
    mask[:3, 2:] = 0  # the first micro-batch of 3 rows gets far fewer tokens than the others
    batch["response_mask"] = mask
    parts = [float(mask[i:i + 3].sum()) for i in range(0, len(batch), 3)]
    assert len(parts) == 3 and len(set(parts)) == 3, parts  # unequal token shares, else any weighting agrees
    batch["advantages"] = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    now = actor.compute_log_probs(batch.select(LEAN), with_ref=False)["old_log_probs"]
    batch["old_log_probs"] = now + 0.3 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(2))
    whole, m_whole = _update_delta(_sgd_like(model_dir, dist_group, grad_clip=0.0), batch)
    split, m_split = _update_delta(_sgd_like(model_dir, dist_group, grad_clip=0.0, micro_batch_size=3), batch)
    assert float(whole.abs().max()) > 0
    torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-7)
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl",
                "actor/grad_norm"):
        assert m_split[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-7), key


def test_a_nan_loss_skips_the_optimizer_step_and_is_counted(actor):
    batch, _ = _rollout_batch(actor)
    batch["advantages"] = torch.ones(batch["response_mask"].shape) * batch["response_mask"]
    poisoned = batch.select(batch.keys())
    poisoned["advantages"] = batch["advantages"] * float("nan")
    before = actor.get_model_state()
    m = actor.update(poisoned, step=7)
    assert m["actor/skipped_updates"] == 1.0
    assert not math.isfinite(m["actor/loss"])
    after = actor.get_model_state()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # The same rows with finite advantages train.
    m = actor.update(batch, step=8)
    assert m["actor/skipped_updates"] == 0.0


def test_a_nan_gradient_from_the_loss_function_is_skipped(actor, monkeypatch):
    from openmanus_rl_core.plugin.registry import registry

    real = registry("loss").get("ppo_clip")

    def poisoned(old, logp, adv, mask, **cfg):
        loss, metrics = real(old, logp, adv, mask, **cfg)
        return loss + logp.sum() * float("nan"), metrics

    monkeypatch.setattr(registry("loss"), "get", lambda name: poisoned)
    batch, _ = _rollout_batch(actor)
    batch["advantages"] = torch.ones(batch["response_mask"].shape) * batch["response_mask"]
    before = actor.get_model_state()
    m = actor.update(batch, step=9)
    assert m["actor/skipped_updates"] == 1.0 and not math.isfinite(m["actor/grad_norm"])
    assert all(torch.equal(before[k], v) for k, v in actor.get_model_state().items())


def test_state_round_trip_restores_weights_optimizer_and_sampling(actor):
    actor.sync_rollout_weights()  # earlier tests may have left the engine behind the trained weights
    state = actor.get_state()
    assert set(state) >= {"model", "optimizer", "scheduler", "rng"}
    batch, _ = _rollout_batch(actor)
    batch["advantages"] = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
    first = actor.update(batch, step=2)
    actor.sync_rollout_weights()
    sample_a = [e.response_ids for e in _rollout_batch(actor)[1]]
    actor.load_state(state["model"], state["optimizer"], state["scheduler"], state["rng"])
    replay, _ = _rollout_batch(actor)  # the same sampler position as the first rollout above
    assert torch.equal(replay["responses"], batch["responses"])
    again = actor.update(batch, step=2)
    actor.sync_rollout_weights()
    sample_b = [e.response_ids for e in _rollout_batch(actor)[1]]
    assert again["actor/loss"] == pytest.approx(first["actor/loss"], abs=1e-7)
    assert again["actor/grad_norm"] == pytest.approx(first["actor/grad_norm"], rel=1e-6)
    assert sample_a == sample_b


def test_a_resume_trains_at_this_runs_learning_rate_not_the_checkpoints(actor):
    """The checkpoint's optimizer state holds its own lr; loading it must not undo a changed actor.lr."""
    state = actor.get_state()
    configured = actor.optimizer.param_groups[0]["initial_lr"]
    for group in actor.optimizer.param_groups:  # what the checkpoint holds: a run at 3x this run's rate
        group["lr"] = group["initial_lr"] = 3 * configured
    older = actor.get_state()
    for group in actor.optimizer.param_groups:
        group["lr"] = group["initial_lr"] = configured
    try:
        actor.load_state(older["model"], older["optimizer"], dict(older["scheduler"], base_lrs=[3 * configured]),
                         older["rng"])
        factor = actor.scheduler.lr_lambdas[0](actor.scheduler.last_epoch)
        assert [g["lr"] for g in actor.optimizer.param_groups] == [configured * factor] * len(
            actor.optimizer.param_groups)
        batch, _ = _rollout_batch(actor)
        batch["advantages"] = torch.zeros(batch["response_mask"].shape)
        assert actor.update(batch, step=3)["actor/lr"] == pytest.approx(configured * factor)
    finally:
        actor.load_state(state["model"], state["optimizer"], state["scheduler"], state["rng"])


def test_the_kl_reference_is_the_policy_rl_starts_from(model_dir, dist_group, actor):
    """With a KL term: the reference is the policy when RL starts (after the warm-up, the warmed-up one, not the
    untrained model); a checkpoint carries it; a checkpoint saved without one gives its own policy."""
    def kl_worker():
        w = ActorWorker(_cfg("algorithm.use_kl_loss=true"), rank=0, world_size=1, model_dir=model_dir, total_steps=10)
        w.setup(*dist_group)
        return w

    def gap(w) -> float:  # the largest |log p_policy - log p_ref| over the batch's response tokens
        lp = w.compute_log_probs(batch)
        return float((lp["old_log_probs"] - lp["ref_log_probs"]).abs().max())

    batch, _ = _rollout_batch(actor)
    w = kl_worker()
    assert gap(w) == 0.0  # both are the model folder's weights
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    demo = batch.select(["input_ids", "attention_mask", "position_ids"])
    demo["loss_mask"] = torch.cat([torch.zeros(len(batch), P), batch["response_mask"]], dim=1)
    for _ in range(3):
        w.sft_update(demo, lr=1e-2, grad_clip=1.0)
    assert gap(w) > 0.05  # warmed up; the reference is still the untrained model
    w.end_warmup()
    assert gap(w) == 0.0  # RL starts here

    batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(1)) \
        * batch["response_mask"]
    batch["ref_log_probs"] = w.compute_log_probs(batch, with_old=False)["ref_log_probs"]
    w.update(batch, step=1)
    drift = gap(w)
    assert drift > 1e-3
    saved = w.get_state()
    resumed = kl_worker()
    resumed.load_state(saved["model"], saved["optimizer"], saved["scheduler"], saved["rng"], saved["ref_model"])
    assert gap(resumed) == pytest.approx(drift, rel=1e-5)
    resumed.load_state(saved["model"], saved["optimizer"], saved["scheduler"], saved["rng"])  # no reference saved
    assert gap(resumed) == 0.0
    assert "ref_model" not in actor.get_state()  # no KL term, no reference


def test_critic_values_start_at_zero_and_regress_towards_the_returns(model_dir, dist_group, actor):
    critic = CriticWorker(_cfg(), rank=0, world_size=1, model_dir=model_dir, total_steps=10)
    critic.setup(*dist_group)
    batch, _ = _rollout_batch(actor)
    values = critic.compute_values(batch)
    assert values.shape == batch["responses"].shape and float(values.abs().max()) == 0.0
    critic.optim_cfg.micro_batch_size = 3  # critic.micro_batch_size splits compute_values' forward passes too
    try:
        import unittest.mock

        with unittest.mock.patch("openmanus_rl_core.workers.critic._value_positions", wraps=_value_positions) as spy:
            assert torch.equal(critic.compute_values(batch), values)
        assert spy.call_count == -(-len(batch) // 3)
    finally:
        critic.optim_cfg.micro_batch_size = None
    batch["values"] = values
    batch["returns"] = torch.full_like(values, 0.3) * batch["response_mask"]
    losses = [critic.update(batch, step=s)["critic/vf_loss"] for s in range(1, 6)]
    assert losses[-1] < losses[0]
    v2 = critic.compute_values(batch)
    mask = batch["response_mask"].bool()
    assert float(v2[mask].mean()) > 0.05


def test_lora_trains_only_the_adapters_and_syncs_them_into_the_engine(model_dir, dist_group, actor):
    cfg = _cfg("model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8")
    w = ActorWorker(cfg, rank=0, world_size=1, model_dir=model_dir, total_steps=10)
    info = w.setup(*dist_group)
    assert 0 < info["trainable"] < info["params"]
    batch, _ = _rollout_batch(w)
    batch["advantages"] = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
    before = w.get_model_state()
    w.update(batch, step=1)
    w.update(batch, step=2)
    after = w.get_model_state()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    w.sync_rollout_weights()
    # The engine holds the plain model and got the adapters merged into the base weights.
    from openmanus_rl_core.models.loading import lora_scaling, merge_lora_state

    engine_sd = w.engine.model.state_dict()
    assert not any("lora_" in k or "base_layer" in k for k in engine_sd)
    merged = merge_lora_state(after, lora_scaling(cfg.model.lora))
    assert set(engine_sd) == set(merged) | {"lm_head.weight"}  # tied lm_head: the engine fills it in
    assert all(torch.equal(engine_sd[k], merged[k]) for k in merged)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], before[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    # What the engine samples with is what the adapter model trains: same log-probs on a fresh rollout.
    batch, _ = _rollout_batch(w)
    mask = batch["response_mask"].bool()
    assert mask.any()
    assert torch.allclose(w.compute_log_probs(batch)["old_log_probs"][mask], batch["rollout_log_probs"][mask],
                          atol=1e-4)


@pytest.mark.parametrize("budget", [None, 40], ids=["one-pass", "token-budget"])
def test_the_rollout_correction_weighs_each_token_by_the_capped_ratio_to_the_engine(model_dir, dist_group, actor,
                                                                                     budget):
    """algorithm.rollout_correction=tis: the update equals a plain one whose advantages are multiplied by
    min(pi_prox / pi_engine, tis_cap), pi_prox being the weights before the update (on-policy within the step: no
    extra forward pass) and pi_engine the rollout's log-probs; also when a token budget splits the rows into
    micro-batches with their padding columns cut."""
    def fresh(*overrides):
        limit = [] if budget is None else [f"actor.max_tokens_per_micro_batch={budget}"]
        w = ActorWorker(_cfg("actor.lr=1e4", "actor.eps=1e4", "actor.grad_clip=0.0", *limit, *overrides), rank=0,
                        world_size=1, model_dir=model_dir, total_steps=10)
        w.setup(*dist_group)
        return w

    batch, _ = _rollout_batch(actor)
    mask = batch["response_mask"]
    gen = torch.Generator().manual_seed(4)
    tis = fresh("algorithm.rollout_correction=tis", "algorithm.tis_cap=2.0")
    now = tis.compute_log_probs(batch.select(LEAN), with_ref=False)["old_log_probs"]  # the weights before the update
    shift = (torch.rand(mask.shape, generator=gen) * 2 - 1) * mask  # log(pi_prox / pi_engine) in [-1, 1]
    batch["rollout_log_probs"] = now - shift
    batch["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    corrected, m = _update_delta(tis, batch)
    by_hand = batch.select([k for k in batch.keys() if k != "rollout_log_probs"])
    by_hand["advantages"] = batch["advantages"] * torch.exp(shift).clamp(max=2.0) * mask
    plain, _ = _update_delta(fresh("algorithm.rollout_correction=off"), by_hand)
    assert float(plain.abs().max()) > 0
    torch.testing.assert_close(corrected, plain, rtol=1e-4, atol=1e-7)
    on = mask.bool()
    assert m["actor/tis_capped_frac"] == pytest.approx(float((shift[on] > math.log(2.0)).float().mean()), abs=1e-6)
    assert m["actor/behav_prox_kl"] == pytest.approx(float(-shift[on].mean()), abs=1e-5)
