"""The baselines of issue 45 as the trainer computes them: self-imitation (``algorithm=self_imitation``) trains on the
policy's own successful samples, and on-policy distillation's (``algorithm=opd``) per-token signal is the teacher's
log-prob minus the policy's, by hand."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.algorithms import ppo_clip_loss
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.protocols import ParsedAction, StepResult
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, build_batch, expand_tasks
from openmanus_rl_core.workers.logprobs import sequence_logprobs

from tiny_hf import save_tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class EvenEnv:
    """One turn: success (reward 1) when the reply has an even number of characters, which a random policy does on
    about half of its samples."""

    instruction = "Reply."

    def reset(self, task_id=None, seed=None):
        return f"task {task_id}"

    def step(self, action):
        won = len(action) % 2 == 0
        return StepResult("ok", float(won), True, {"success": won})

    def close(self):
        pass


class Plain:
    stop: list[str] = []

    def system_prompt(self, instruction):
        return instruction

    def parse(self, text):
        return ParsedAction("action", text, True)

    def render(self, action, thought=""):
        return action


class ThirdEnv(EvenEnv):
    """One turn: success (reward 1) on every third task, whatever the reply."""

    def reset(self, task_id=None, seed=None):
        self.task = int(task_id)
        return f"task {task_id}"

    def step(self, action):
        won = self.task % 3 == 0
        return StepResult("ok", float(won), True, {"success": won})


def last_token(reward, turn_rewards, segments, length):
    out = [0.0] * length
    out[segments[-1][1] - 1] = float(reward)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.models.loading import load_tokenizer

    root = tmp_path_factory.mktemp("models")
    student, teacher = save_tiny("llama", root / "student", seed=0), save_tiny("llama", root / "teacher", seed=1)
    tok = load_tokenizer(str(student))
    assert tok.get_vocab() == load_tokenizer(str(teacher)).get_vocab()  # one tokenizer, two sets of weights
    return tok, *(AutoModelForCausalLM.from_pretrained(str(p)).eval() for p in (student, teacher))


def test_self_imitation_trains_on_the_policys_own_successful_samples(models):
    tok, policy, _ = models
    cfg = RolloutConfig(max_turns=1, max_new_tokens=6, temperature=1.0, n=8)
    loop = AgentLoop(HFEngine(policy, tok, seed=0), tok, Plain(), EvenEnv, cfg)
    episodes = loop.run(expand_tasks([{"task_id": t, "seed": 0} for t in range(4)], 8))
    batch = build_batch(episodes, None, last_token, tok.pad_token_id)
    won = torch.tensor([bool(e.trajectory.success) for e in episodes])
    assert 0 < int(won.sum()) < len(episodes)  # the policy's own samples hold successes and failures

    adv, _ = registry("advantage").get("self_imitation")(batch)
    mask = batch["response_mask"]
    assert torch.equal(adv, mask * won[:, None].float())  # 1 on the successes' sampled tokens, 0 elsewhere
    for i, e in enumerate(episodes):  # those tokens are the ones the engine sampled from this policy
        assert batch["responses"][i, : len(e.response_ids)].tolist() == e.response_ids

    # The update's gradient (PPO-clip at ratio 1, token-mean) is supervised learning on the successful samples
    # alone: the gradient of their tokens' mean negative log-likelihood, scaled by their share of the tokens.
    def grads(loss_of):
        policy.zero_grad()
        logp = sequence_logprobs(policy, batch)[0]
        loss_of(logp).backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])

    rl = grads(lambda logp: ppo_clip_loss(logp.detach(), logp, adv, mask)[0])
    kept = mask * won[:, None]
    sft = grads(lambda logp: -(logp * kept).sum() / kept.sum())
    assert torch.allclose(rl, sft * (kept.sum() / mask.sum()), atol=1e-6, rtol=1e-4)
    assert rl.abs().sum() > 0


def test_opd_signal_is_the_teachers_log_prob_minus_the_policys_at_each_sampled_token(models):
    tok, student, teacher = models
    prompt, responses = [5, 9, 17, 33], [[40, 41, 42, 43, 44], [50, 51, 52, 0, 0]]
    lengths = [5, 3]
    P, R = len(prompt), len(responses[0])
    input_ids = torch.tensor([prompt + r for r in responses])
    attention = torch.ones_like(input_ids)
    attention[1, P + 3:] = 0
    batch = Batch(tensors={"input_ids": input_ids, "attention_mask": attention,
                           "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
                           "responses": torch.tensor(responses), "response_mask": attention[:, P:].float()})
    with torch.no_grad():
        batch["old_log_probs"] = sequence_logprobs(student, batch)[0]  # as the trainer's phase_log_probs does
        batch["ref_log_probs"] = sequence_logprobs(teacher, batch)[0]  # the reference policy is the teacher
    adv, _ = registry("advantage").get("opd")(batch)

    hand = torch.zeros(2, R)
    with torch.no_grad():
        for i, (resp, n) in enumerate(zip(responses, lengths)):
            ids = torch.tensor([prompt + resp[:n]])
            s, t = (torch.log_softmax(m(ids).logits[0].double(), -1) for m in (student, teacher))
            for k in range(n):  # token k of the response is predicted at position P + k - 1
                hand[i, k] = float(t[P + k - 1, resp[k]] - s[P + k - 1, resp[k]])
    assert torch.allclose(adv, hand, atol=1e-5)
    assert adv[1, 3:].eq(0).all() and adv[0].abs().min() > 0  # padding gets nothing; every real token a signal


def test_opd_without_a_teacher_and_a_teacher_that_is_no_model_are_one_line(tmp_path):
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.loading import load

    with pytest.raises(ConfigError, match=r"^algorithm.teacher.path=None: algorithm.adv_estimator=opd learns"):
        load(["algorithm=opd"])
    with pytest.raises(ConfigError, match=rf"^algorithm.teacher.path={tmp_path}: not a model folder"):
        load(["algorithm=opd", f"algorithm.teacher.path={tmp_path}"])


def test_the_model_demonstrator_keeps_a_folders_greedy_episodes_with_their_rewards(tmp_path):
    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.models.loading import load_tokenizer
    from openmanus_rl_core.rollout import ChatDelta
    from openmanus_rl_core.run.warmup import model_demonstrations

    folder = save_tiny("llama", tmp_path / "demonstrator", seed=0)
    tok = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    chat = ChatDelta(tok)
    reply = tok.encode("take key", add_special_tokens=False) + list(chat.end_ids)
    prompts = [chat.prompt_ids("Reply.", f"task {t}", None) for t in range(4)]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):  # a few steps teach the random model to answer "take key", so that it acts at all
        loss = sum(torch.nn.functional.cross_entropy(model(torch.tensor([p + reply])).logits[0, len(p) - 1:-1],
                                                     torch.tensor(reply)) for p in prompts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(str(folder))

    cfg = load(["warmup.demonstrator=model", f"warmup.model_path={folder}", "env.max_turns=1",
                "rollout.max_new_tokens=6"])
    tasks = [{"task_id": t, "seed": 0} for t in range(12)]
    shown = model_demonstrations(cfg, ThirdEnv, Plain(), tasks)
    greedy = AgentLoop(HFEngine(model, tok, seed=5), tok, Plain(), ThirdEnv,
                       RolloutConfig(max_turns=1, max_new_tokens=6, greedy=True, n=1))
    replies = [e.trajectory.turns[0].action.content for e in greedy.run(expand_tasks(tasks, 1))]
    assert replies == ["take key"] * 12
    assert [t["task_id"] for t in shown] == list(range(12))
    assert [t["demonstration"]["steps"] for t in shown] == [[("take key", "ok")]] * 12  # the folder's greedy play
    for t in shown:  # successes and failures alike, each with its reward
        demo = t["demonstration"]
        assert demo["observation"] == f"task {t['task_id']}"
        assert demo["success"] == (t["task_id"] % 3 == 0) and demo["reward"] == float(demo["success"])
