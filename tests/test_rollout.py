"""The multi-turn agent loop, the batch it builds and its metrics (openmanus_rl_core/rollout/)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest
import torch

from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.protocols import Generation, ParsedAction, SamplingParams, StepResult
from openmanus_rl_core.rollout import (
    AgentLoop,
    ChatDelta,
    Episode,
    EnvCallPool,
    RolloutConfig,
    build_batch,
    expand_tasks,
    rollout_metrics,
    tokenizer_corpus,
)

RAISE, HANG, RESET_RAISE, GARBAGE, LONG_OBS = 100, 101, 102, 103, 104


# ------------------------------------------------------------------------------------------- test parts
class CountEnv:
    """Ends after ``1 + task_id % 3`` steps (success); special task ids misbehave (see the constants)."""

    instruction = "Say anything; the episode ends after a few steps."

    def __init__(self, log: dict, release: threading.Event, steps: int | None = None, sleep: float = 0.0):
        self.log, self.release, self.fixed_steps, self.sleep = log, release, steps, sleep
        self.task = None
        self.k = 0
        log.setdefault("created", 0)
        log["created"] += 1

    def reset(self, task_id=None, seed=None):
        self.task, self.k = task_id, 0
        if task_id == RESET_RAISE:
            raise ConnectionError("server went away")
        return f"task {task_id} seed {seed}: start" + (" padding" * 200 if task_id == LONG_OBS else "")

    def step(self, action):
        if self.sleep:
            time.sleep(self.sleep)
        if self.task == RAISE:
            raise RuntimeError("boom")
        if self.task == HANG:
            self.release.wait(30)
            return StepResult("late", 0.0, False, {})
        if self.task == GARBAGE:
            return {"observation": "not a StepResult"}
        self.k += 1
        steps = self.fixed_steps or (1 + (self.task or 0) % 3)
        done = self.k >= steps
        obs = f"step {self.k} of {steps}"
        if self.task == LONG_OBS:
            obs += " more" * 300
        return StepResult(obs, 0.5 if done else 0.1, done, {"success": True} if done else {})

    def close(self):
        self.log.setdefault("closed", 0)
        self.log["closed"] += 1


class PlainTemplate:
    stop: list[str] = []

    def system_prompt(self, instruction):
        return f"You act. {instruction}"

    def parse(self, text):
        return ParsedAction("action", text.strip(), bool(text.strip()))

    def render(self, action, thought=""):
        return action


class CountingEngine:
    """Wraps an engine; records every generate call (batch size) and its generations."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[int] = []
        self.outputs: list[list[Generation]] = []

    def generate(self, prompts, params):
        self.calls.append(len(prompts))
        out = self.inner.generate(prompts, params)
        self.outputs.append(out)
        return out

    def update_weights(self, sd):
        self.inner.update_weights(sd)


class ScriptedEngine:
    """Returns ``reply`` for every prompt (logprob -0.5 each)."""

    def __init__(self, tok, reply_ids):
        self.tok, self.reply = tok, list(reply_ids)
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params):
        self.prompts.extend(list(p) for p in prompts)
        ids = self.reply[: params.max_new_tokens]
        return [Generation(list(ids), [-0.5] * len(ids), self.tok.decode(ids, skip_special_tokens=True),
                           "stop" if ids and ids[-1] == self.tok.eos_token_id else "length") for _ in prompts]

    def update_weights(self, sd):
        pass


@dataclass
class BD:  # the shape of rewards.RewardBreakdown that build_batch reads
    total: float
    parts: dict = field(default_factory=dict)
    turn_rewards: list = field(default_factory=list)


def last_token(reward, turn_rewards, segments, length):
    out = [0.0] * length
    segs = [s for s in segments if s[1] > s[0]]
    if segs:
        out[segs[-1][1] - 1] = float(reward)
    return out


# ---------------------------------------------------------------------------------------------- fixtures
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    texts = ["step 1 of 3", "task 4 seed 2: start", "You act. Say anything; the episode ends after a few steps."] * 3
    return build_tokenizer(texts + [f"word{i} another" for i in range(30)], vocab_size=360)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                            seed=2)


@pytest.fixture()
def env_log():
    log: dict = {}
    release = threading.Event()
    yield log, release
    release.set()  # let a hung env thread finish


def make_loop(model, tok, env_log, engine=None, **cfg):
    log, release = env_log
    steps, sleep = cfg.pop("steps", None), cfg.pop("sleep", 0.0)
    base = dict(max_turns=4, max_new_tokens=10, temperature=0.8, env_timeout_s=5.0)
    base.update(cfg)
    engine = engine or CountingEngine(HFEngine(model, tok, seed=0))
    return AgentLoop(engine, tok, PlainTemplate(), lambda: CountEnv(log, release, steps, sleep), RolloutConfig(**base))


def recompute_logprobs(model, ep: Episode, temperature: float) -> torch.Tensor:
    ids = torch.tensor([ep.prompt_ids + ep.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature
    P = len(ep.prompt_ids)
    lp = torch.log_softmax(logits[P - 1: -1], -1)
    return lp.gather(-1, torch.tensor(ep.response_ids)[:, None])[:, 0]


# -------------------------------------------------------------------------------------------------- tests
def test_loss_mask_and_logprobs_match_a_forward_pass(model, tok, env_log):
    loop = make_loop(model, tok, env_log, max_turns=4, max_new_tokens=12, temperature=0.8)
    tasks = [{"task_id": i, "seed": i} for i in range(6)]
    episodes = loop.run(tasks)
    engine = loop.engine
    chat = ChatDelta(tok)
    for b, ep in enumerate(episodes):
        traj = ep.trajectory
        assert traj.termination == "done", (traj.termination, traj.error)
        assert len(ep.response_ids) == len(ep.response_mask) == len(ep.logprobs) == traj.response_length
        # The prompt is the chat template's rendering of system + first observation.
        want_prompt = tok.apply_chat_template(
            [{"role": "system", "content": PlainTemplate().system_prompt(CountEnv.instruction)},
             {"role": "user", "content": traj.initial_observation}], tokenize=False, add_generation_prompt=True)
        assert ep.prompt_ids == tok.encode(want_prompt, add_special_tokens=False)
        # Mask is 1 exactly on the generated tokens, which sit unchanged at each turn's span.
        expect_mask = [0] * len(ep.response_ids)
        for t, tr in enumerate(traj.turns):
            s, e = tr.span
            # The episode's position within the t-th generate call.
            live = [x for x in episodes if x.trajectory.num_turns > t]
            gen = engine.outputs[t][live.index(ep)]
            assert ep.response_ids[s:e] == gen.token_ids
            assert ep.logprobs[s:e] == pytest.approx(gen.logprobs)
            expect_mask[s:e] = [1] * (e - s)
            if t + 1 < traj.num_turns:  # the observation delta between this reply and the next
                nxt = traj.turns[t + 1].span[0]
                delta = tok.decode(ep.response_ids[e:nxt])
                obs = f"<|im_start|>user\n{tr.observation}<|im_end|>\n<|im_start|>assistant\n"
                ended = gen.token_ids and gen.token_ids[-1] == tok.eos_token_id
                assert delta == ("\n" if ended else "<|im_end|>\n") + obs
                assert ep.response_ids[e:nxt] == chat.obs_ids(tok.encode(tr.observation, add_special_tokens=False),
                                                              gen.token_ids)
        assert ep.response_mask == expect_mask
        assert sum(ep.response_mask) == sum(e - s for s, e in traj.segments)
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.response_mask) if m == 0)
        ref = recompute_logprobs(model, ep, 0.8)
        m = torch.tensor(ep.response_mask, dtype=torch.bool)
        assert torch.allclose(ref[m], torch.tensor(ep.logprobs)[m], atol=1e-4), b
        assert ep.anchor_obs[0] == traj.initial_observation
        assert ep.anchor_obs[1:] == [tr.observation for tr in traj.turns[:-1]]
    assert env_log[0]["closed"] == env_log[0]["created"] == 6


def test_one_generate_call_per_turn(model, tok, env_log):
    loop = make_loop(model, tok, env_log, max_turns=4)
    episodes = loop.run([{"task_id": i, "seed": 0} for i in range(9)])
    engine = loop.engine
    turns = max(e.trajectory.num_turns for e in episodes)
    assert len(engine.calls) == turns == loop.stats["generate_calls"] == len(loop.stats["turns"])
    assert engine.calls[0] == 9
    # Each call carries exactly the episodes still live at that turn.
    for t, size in enumerate(engine.calls):
        assert size == sum(e.trajectory.num_turns > t for e in episodes)
    assert engine.calls == sorted(engine.calls, reverse=True) and engine.calls[-1] < 9
    done = [e for e in episodes if e.trajectory.termination == "done"]
    assert done and all(e.trajectory.success for e in done)
    assert all(e.trajectory.num_turns == 1 + e.trajectory.task_id % 3 for e in done)


def test_env_errors_end_only_their_episode(model, tok, env_log):
    loop = make_loop(model, tok, env_log, env_timeout_s=0.5, max_turns=3)
    tasks = [{"task_id": i, "seed": 1} for i in (0, 1, 2, RAISE, HANG, RESET_RAISE, GARBAGE)]
    t0 = time.perf_counter()
    episodes = loop.run(tasks)
    assert time.perf_counter() - t0 < 10  # the hung env cost one timeout, not the run
    by_task = {e.trajectory.task_id: e.trajectory for e in episodes}
    assert by_task[RAISE].termination == "env_error" and "RuntimeError: boom" in by_task[RAISE].error
    assert by_task[HANG].termination == "env_error" and "timed out" in by_task[HANG].error
    assert by_task[RESET_RAISE].termination == "env_error" and "server went away" in by_task[RESET_RAISE].error
    assert by_task[RESET_RAISE].num_turns == 0
    assert by_task[GARBAGE].termination == "env_error" and "not a StepResult" in by_task[GARBAGE].error
    for i in (0, 1, 2):
        assert by_task[i].termination == "done" and by_task[i].success, by_task[i].error
    # close() was called on every env, the hung one included (in its own thread).
    deadline = time.time() + 2
    while env_log[0].get("closed", 0) < env_log[0]["created"] and time.time() < deadline:
        time.sleep(0.01)
    assert env_log[0]["closed"] == env_log[0]["created"] == len(tasks)
    # Excluded from the loss by default, kept with the switch.
    batch = build_batch(episodes, None, last_token, tok.pad_token_id)
    for i, e in enumerate(episodes):
        if e.trajectory.termination == "env_error":
            assert batch["response_mask"][i].sum() == 0
        else:
            assert batch["response_mask"][i].sum() == sum(e.response_mask) > 0
    kept = build_batch(episodes, None, last_token, tok.pad_token_id, keep_env_errors=True)
    raise_row = [e.trajectory.task_id for e in episodes].index(RAISE)
    assert kept["response_mask"][raise_row].sum() == sum(episodes[raise_row].response_mask) > 0
    m = rollout_metrics(episodes)
    assert m["rollout/termination/env_error"] == 4


def test_env_steps_run_concurrently(model, tok, env_log):
    loop = make_loop(model, tok, env_log, steps=2, sleep=0.2, max_turns=2, max_new_tokens=4)
    loop.run([{"task_id": i, "seed": 0} for i in range(8)])
    for turn in loop.stats["turns"]:
        if turn["stepped"] == 8:
            assert turn["env_s"] < 0.2 * 3  # 8 sequential calls would take 1.6 s


def test_n_samples_share_group_task_and_seed(model, tok, env_log):
    tasks = expand_tasks([{"task_id": 1, "seed": 7}, {"task_id": 2, "seed": 8}], 3)
    assert [t["task_id"] for t in tasks] == [1, 1, 1, 2, 2, 2]
    assert [t["seed"] for t in tasks] == [7, 7, 7, 8, 8, 8]
    g = [t["group_id"] for t in tasks]
    assert g[0] == g[1] == g[2] != g[3] == g[4] == g[5]
    assert expand_tasks([{"task_id": 1, "group_id": "x"}], 2)[1]["group_id"] == "x"
    with pytest.raises(ValueError):
        expand_tasks(tasks, 0)
    loop = make_loop(model, tok, env_log, temperature=1.0)
    episodes = loop.run(tasks)
    assert [e.group_id for e in episodes] == g
    assert len({e.uid for e in episodes}) == 6
    assert len({e.trajectory.initial_observation for e in episodes[:3]}) == 1
    assert episodes[0].prompt_ids == episodes[1].prompt_ids == episodes[2].prompt_ids
    # Different samples of one task usually differ (sampling, not copies).
    assert len({tuple(e.response_ids) for e in episodes[:3]}) > 1
    batch = build_batch(episodes, None, last_token, tok.pad_token_id)
    assert list(batch["group_ids"]) == g


def test_token_limits_are_recorded(model, tok, env_log):
    # Response budget: a 10-step env cannot fit in 30 response tokens.
    loop = make_loop(model, tok, env_log, steps=10, max_turns=10, max_new_tokens=10, max_response_tokens=30)
    for ep in loop.run([{"task_id": 0, "seed": 0}, {"task_id": 1, "seed": 0}]):
        assert ep.trajectory.termination == "truncated" and ep.truncated
        assert len(ep.response_ids) <= 30
    # Turn limit.
    loop = make_loop(model, tok, env_log, steps=10, max_turns=2)
    eps = loop.run([{"task_id": 0, "seed": 0}])
    assert eps[0].trajectory.termination == "max_turns" and eps[0].trajectory.num_turns == 2
    assert not eps[0].truncated
    assert eps[0].response_mask[-1] == 1  # no observation tokens after the last reply
    # Observation limit (first observation and later ones), and the prompt limit.
    loop = make_loop(model, tok, env_log, steps=3, max_turns=3, max_obs_tokens=16)
    ep = loop.run([{"task_id": LONG_OBS, "seed": 0}])[0]
    assert ep.truncated and ep.trajectory.info["obs_truncated"] >= 1
    full = len(tok.encode(ep.trajectory.initial_observation, add_special_tokens=False))
    assert len(ep.prompt_ids) < full
    loop = make_loop(model, tok, env_log, max_prompt_tokens=20, max_obs_tokens=1000)
    ep = loop.run([{"task_id": LONG_OBS, "seed": 0}])[0]
    assert len(ep.prompt_ids) == 20 and ep.truncated and ep.trajectory.info["prompt_truncated"]


def test_the_response_budget_ends_an_episode_whose_observation_leaves_no_room_for_a_reply(tok, env_log):
    reply = tok.encode("hi there", add_special_tokens=False) + [tok.eos_token_id]
    delta = ChatDelta(tok).obs_ids(tok.encode("step 1 of 3", add_special_tokens=False), reply)
    log, release = env_log

    def run(budget):
        loop = AgentLoop(ScriptedEngine(tok, reply), tok, PlainTemplate(), lambda: CountEnv(log, release, 3),
                         RolloutConfig(max_turns=5, max_new_tokens=20, max_response_tokens=budget))
        return loop.run([{"task_id": 0, "seed": 0}])[0]

    # The first observation fills the budget exactly: it is not appended, and no empty turn follows.
    ep = run(len(reply) + len(delta))
    assert ep.trajectory.termination == "truncated" and ep.truncated
    assert ep.trajectory.num_turns == 1 and ep.response_ids == reply and ep.response_mask == [1] * len(reply)
    # One token more: the observation fits and the second reply is cut to that one token.
    ep = run(len(reply) + len(delta) + 1)
    assert ep.trajectory.termination == "truncated" and ep.trajectory.num_turns == 2
    assert ep.response_ids == reply + delta + reply[:1]
    assert ep.response_mask == [1] * len(reply) + [0] * len(delta) + [1]


def test_exact_layout_with_scripted_replies(tok, env_log):
    chat = ChatDelta(tok)
    hi = tok.encode("hi there", add_special_tokens=False)
    eos = tok.eos_token_id
    for reply, ends in ((hi + [eos], True), (hi, False)):
        log, release = env_log
        eng = ScriptedEngine(tok, reply)
        loop = AgentLoop(eng, tok, PlainTemplate(), lambda: CountEnv(log, release, 2),
                         RolloutConfig(max_turns=5, max_new_tokens=20))
        ep = loop.run([{"task_id": 0, "seed": 0}])[0]
        tr = ep.trajectory
        assert tr.termination == "done" and tr.num_turns == 2 and tr.success
        obs = tok.encode(tr.turns[0].observation, add_special_tokens=False)
        delta = ([] if ends else [eos]) + tok.encode("\n<|im_start|>user\n", add_special_tokens=False) + obs + \
            tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        assert chat.obs_ids(obs, reply) == delta
        assert ep.response_ids == reply + delta + reply
        assert ep.response_mask == [1] * len(reply) + [0] * len(delta) + [1] * len(reply)
        assert ep.logprobs == [-0.5] * len(reply) + [0.0] * len(delta) + [-0.5] * len(reply)
        assert tr.segments == [(0, len(reply)), (len(reply) + len(delta), 2 * len(reply) + len(delta))]
        # Token-in: the second prompt is exactly the first prompt + the first reply + the delta.
        assert eng.prompts[1] == ep.prompt_ids + reply + delta
        assert [t.reward for t in tr.turns] == [0.1, 0.5]
        assert tr.turns[0].action.content == "hi there"


def test_empty_reply_is_invalid(tok, env_log):
    log, release = env_log
    loop = AgentLoop(ScriptedEngine(tok, [tok.eos_token_id]), tok, PlainTemplate(),
                     lambda: CountEnv(log, release, 3), RolloutConfig(max_turns=3))
    ep = loop.run([{"task_id": 0, "seed": 0}])[0]
    assert ep.trajectory.termination == "invalid" and ep.trajectory.num_turns == 1
    assert ep.response_mask == [1]


@pytest.mark.parametrize("mode", ["lockstep", "episodes"])
def test_an_env_that_never_ends_stops_every_episode_at_max_turns(tok, env_log, mode):
    """max_turns=3 over an env that never says done: every episode has exactly 3 replies, ends as max_turns
    (no success), with no observation after its last reply, and every env is closed."""
    log, release = env_log
    reply = tok.encode("hi there", add_special_tokens=False) + [tok.eos_token_id]
    engine = CountingEngine(ScriptedEngine(tok, reply))
    loop = AgentLoop(engine, tok, PlainTemplate(), lambda: CountEnv(log, release, steps=10**6),
                     RolloutConfig(max_turns=3, max_new_tokens=20, mode=mode))
    episodes = loop.run(expand_tasks([{"task_id": i, "seed": i} for i in range(3)], 2))
    assert [e.trajectory.num_turns for e in episodes] == [3] * 6
    assert [e.trajectory.termination for e in episodes] == ["max_turns"] * 6
    assert not any(e.trajectory.success for e in episodes)
    for ep in episodes:
        assert ep.trajectory.segments[-1][1] == len(ep.response_ids)  # the last reply ends the response
        assert [t.observation for t in ep.trajectory.turns] == [f"step {k} of 1000000" for k in (1, 2, 3)]
    assert sum(engine.calls) == 6 * 3
    assert log["closed"] == log["created"] == 6


@pytest.mark.parametrize("k", [1, 3])
def test_no_generate_call_gets_more_than_gen_batch_size_prompts(tok, env_log, k):
    """rollout.mode=episodes, gen_batch_size=k, 7 episodes of 3 turns: every generate call carries at most k
    prompts (k itself while 7 episodes wait), and together they carry every reply once."""
    log, release = env_log
    reply = tok.encode("hi there", add_special_tokens=False) + [tok.eos_token_id]
    engine = CountingEngine(ScriptedEngine(tok, reply))
    loop = AgentLoop(engine, tok, PlainTemplate(), lambda: CountEnv(log, release, steps=10**6),
                     RolloutConfig(max_turns=3, max_new_tokens=20, mode="episodes", gen_batch_size=k,
                                   gen_wait_ms=50))
    episodes = loop.run(expand_tasks([{"task_id": i, "seed": i} for i in range(7)], 1))
    assert all(e.trajectory.num_turns == 3 for e in episodes)
    assert max(engine.calls) == k, engine.calls
    assert sum(engine.calls) == loop.stats["gen_rows"] == 7 * 3
    assert len(engine.calls) == loop.stats["generate_calls"] >= -(-7 * 3 // k)


def test_build_batch_tensors(model, tok, env_log):
    loop = make_loop(model, tok, env_log, max_turns=3)
    episodes = loop.run([{"task_id": i, "seed": 0} for i in range(4)])
    bds = [BD(total=float(i), parts={"goal": float(i)},
              turn_rewards=[0.0] * (e.trajectory.num_turns - 1) + [float(i)] if e.trajectory.num_turns else [])
           for i, e in enumerate(episodes)]
    batch = build_batch(episodes, bds, last_token, tok.pad_token_id)
    B = 4
    P = max(len(e.prompt_ids) for e in episodes)
    R = max(len(e.response_ids) for e in episodes)
    assert batch["prompts"].shape == (B, P) and batch["responses"].shape == (B, R)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["position_ids"].shape == (B, P + R)
    for i, e in enumerate(episodes):
        p, r = len(e.prompt_ids), len(e.response_ids)
        assert batch["prompts"][i, P - p:].tolist() == e.prompt_ids  # left-padded
        assert (batch["prompts"][i, : P - p] == tok.pad_token_id).all()
        assert batch["responses"][i, :r].tolist() == e.response_ids  # right-padded
        assert batch["attention_mask"][i].tolist() == [0] * (P - p) + [1] * (p + r) + [0] * (R - r)
        assert batch["position_ids"][i, P - p: P + r].tolist() == list(range(p + r))
        assert batch["response_mask"][i, :r].tolist() == [float(m) for m in e.response_mask]
        assert batch["response_mask"][i, r:].sum() == 0
        assert torch.allclose(batch["rollout_log_probs"][i, :r], torch.tensor(e.logprobs))
        assert batch["step_ids"][i, :r].tolist() == e.step_ids
        scores = batch["token_level_scores"][i]
        assert float(scores.sum()) == pytest.approx(float(i))
        if i:
            assert int(scores.nonzero()[-1]) == e.trajectory.segments[-1][1] - 1
        steps = batch["step_ids"][i]
        for t, (s, end) in enumerate(e.trajectory.segments):
            assert (steps[s:end] == t).all()
        assert (steps[batch["response_mask"][i] == 0] == -1).all()
    assert batch["response_mask"].dtype == torch.float32 and batch["step_ids"].dtype == torch.long
    assert list(batch["num_turns"]) == [e.trajectory.num_turns for e in episodes]
    assert list(batch["task_id"]) == [0, 1, 2, 3]
    assert [list(x) for x in batch["step_rewards"]] == [b.turn_rewards for b in bds]
    assert [len(a) for a in batch["anchor_obs"]] == [e.trajectory.num_turns for e in episodes]
    assert list(batch["reward"]) == [0.0, 1.0, 2.0, 3.0]
    assert set(batch.non_tensors) >= {"group_ids", "uid", "anchor_obs", "step_rewards", "success", "termination",
                                      "num_turns", "task_id"}
    with pytest.raises(ValueError, match="breakdowns"):
        build_batch(episodes, bds[:2], last_token, tok.pad_token_id)


def test_rollout_metrics(model, tok, env_log):
    loop = make_loop(model, tok, env_log, max_turns=3)
    episodes = loop.run([{"task_id": i, "seed": 0} for i in range(4)])
    m = rollout_metrics(episodes)
    for key in ("rollout/success_rate", "rollout/turns/mean", "rollout/termination/done",
                "rollout/response_length/mean", "rollout/turns_per_s", "rollout/tokens_per_s"):
        assert key in m
    assert 0 <= m["rollout/success_rate"] <= 1
    assert m["rollout/turns/mean"] == pytest.approx(sum(e.trajectory.num_turns for e in episodes) / 4)
    assert sum(v for k, v in m.items() if k.startswith("rollout/termination/")) == 4
    assert rollout_metrics([]) == {}


def test_rollout_section_follows_the_env_and_the_algorithm():
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.rollout import sampling_params

    c = load(["env=guess_number", "algorithm.n=3"]).rollout
    assert c.max_turns == 6 and c.n == 3 and isinstance(c.temperature, float)
    assert load(["env=guess_number", "rollout.max_turns=2"]).rollout.max_turns == 2
    with pytest.raises(ConfigError, match=r"^rollout.max_turns=0: must be >= 1$"):
        load(["rollout.max_turns=0"])
    sp = sampling_params(RolloutConfig(temperature=0.5, top_k=3), ["</a>"])
    assert isinstance(sp, SamplingParams) and sp.stop == ["</a>"] and sp.top_k == 3 and sp.temperature == 0.5


def test_no_threads_left_behind(model, tok, env_log):
    before = threading.active_count()
    loop = make_loop(model, tok, env_log, max_turns=2, max_new_tokens=4)
    for _ in range(3):
        loop.run([{"task_id": i, "seed": 0} for i in range(6)])
    deadline = time.time() + 2
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before


def test_env_call_pool_timeouts_do_not_starve():
    pool = EnvCallPool(max_workers=2)
    block = threading.Event()
    try:
        futs = [pool.submit(block.wait, 10) for _ in range(2)]
        assert [s.value for s, _ in pool.collect(futs, 0.2)] == ["timeout", "timeout"]
        # Both workers are stuck; new calls still run (abandoned threads are replaced).
        out = pool.collect([pool.submit(lambda x: x * 2, i) for i in range(3)] + [pool.submit(int, "x")], 2.0)
        assert [(s.value, v) for s, v in out[:3]] == [("ok", 0), ("ok", 2), ("ok", 4)] and out[3][0].value == "error"
    finally:
        block.set()


def test_env_call_pool_threads_keep_nothing_of_a_finished_call():
    """An idle worker holds no reference to its last call: otherwise the thread drops it when it ends, and a daemon
    thread freeing an engine's torch tensors while the interpreter exits aborts the process."""
    import gc
    import weakref

    class Env:
        def step(self, action):
            if action == "bad":
                raise ValueError("bad action")
            return action

    pool = EnvCallPool(max_workers=1)  # one worker: both calls run on the same thread, which stays alive
    try:
        for action, expected in (("go", ("ok", "go")), ("bad", ("error", "bad action"))):
            env = Env()
            gone = weakref.ref(env)
            [(status, value)] = pool.collect([pool.submit(env.step, action)], 2.0)
            assert (status.value, str(value)) == expected
            del env, value  # an error's traceback refers to the env's frame: the caller lets go of it here
            deadline = time.monotonic() + 2.0  # the worker lets go just after it sets the result
            while gone() is not None and time.monotonic() < deadline:
                gc.collect()
                time.sleep(0.01)
            assert gone() is None, action  # the worker is idle on its queue and keeps nothing of the call
    finally:
        pool.shutdown()


def test_tokenizer_corpus_uses_the_oracle():
    class Oracle:
        instruction = "guess"

        def reset(self, task_id=None, seed=None):
            self.n = 0
            return f"start {task_id}"

        def oracle_action(self):
            return "go"

        def step(self, a):
            self.n += 1
            return StepResult(f"obs {self.n}", 0.0, self.n >= 2)

        def close(self):
            pass

    texts = tokenizer_corpus(Oracle, PlainTemplate(), [{"task_id": 3, "seed": 0}], max_turns=5)
    assert texts == ["You act. guess", "start 3", "go", "obs 1", "go", "obs 2"]


def test_builtin_key_door_with_react_template(model, tok, env_log):
    from openmanus_rl_core.plugin.registry import registry

    try:
        template = registry("template").build("react")
        registry("env").get("key_door")
    except Exception:  # the built-in plugins are optional for the core's tests
        pytest.skip("react template / key_door env plugins not installed")
    engine = HFEngine(model, tok, seed=1)
    loop = AgentLoop(engine, tok, template, lambda: registry("env").build("key_door"),
                     RolloutConfig(max_turns=3, max_new_tokens=16, temperature=1.0))
    episodes = loop.run(expand_tasks([{"task_id": 0, "seed": 0}, {"task_id": 1, "seed": 0}], 2))
    for ep in episodes:
        assert ep.trajectory.termination in ("max_turns", "invalid", "done")
        ref = recompute_logprobs(model, ep, 1.0)
        m = torch.tensor(ep.response_mask, dtype=torch.bool)
        assert torch.allclose(ref[m], torch.tensor(ep.logprobs)[m], atol=1e-4)
        assert all(not t.action.valid or t.action.content for t in ep.trajectory.turns)


@pytest.mark.parametrize("mode", ["lockstep", "episodes"])
def test_a_stop_abandons_the_rollout_while_an_env_call_hangs(model, tok, env_log, mode):
    from openmanus_rl_core.process.stopping import Abandoned

    loop = make_loop(model, tok, env_log, mode=mode, env_timeout_s=20.0)
    t0 = time.monotonic()
    loop.abandon = lambda: time.monotonic() > t0 + 0.3
    with pytest.raises(Abandoned, match="the run is stopping"):
        loop.run(expand_tasks([{"task_id": HANG, "seed": 1}, {"task_id": 1, "seed": 2}], 1))
    took = time.monotonic() - t0
    assert 0.3 <= took < 3.0, took  # not the 20 s env timeout of the hung step
    if mode == "lockstep":  # every env was closed on the way out, the hung one too
        assert env_log[0]["closed"] == env_log[0]["created"] == 2

    loop.abandon = lambda: True  # already stopping: no env is even made
    before = env_log[0]["created"]
    with pytest.raises(Abandoned):
        loop.run(expand_tasks([{"task_id": 1, "seed": 2}], 1))
    assert env_log[0]["created"] == before
