"""Memories (what context each reply sees) and per-turn training samples (issue #15)."""

from __future__ import annotations

import pytest
import torch

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.engines.hf import HFEngine
from openmanus_rl_core.models.loading import build_tiny_model, build_tokenizer
from openmanus_rl_core.protocols import ParsedAction, PastTurn, Trajectory, Turn
from openmanus_rl_core.plugin.registry import UnknownPluginError, build, registry
from openmanus_rl_core.rollout import AgentLoop, Episode, RolloutConfig, build_batch, expand_tasks, tokenizer_corpus
from openmanus_rl_core.rollout.records import episode_record, write_html
from openmanus_rl_core.testing import ConformanceError, check_memory


def memory(name: str, **kwargs):
    return build("memory", {"name": name, "kwargs": kwargs})


# ------------------------------------------------------------------------------------------- the kit
def test_a_memory_that_hides_the_current_observation_fails_the_kit():
    class TaskOnly:
        per_turn = True

        def messages(self, system, task, history):
            return [{"role": "system", "content": system}, {"role": "user", "content": task}]

    with pytest.raises(ConformanceError, match="current observation"):
        check_memory(TaskOnly())


# -------------------------------------------------------------------------------------------- the config
def test_memory_is_full_by_default_and_window_is_one_override_away():
    assert load([]).memory.name == "full"
    cfg = load(["memory=window", "memory.window=3"])
    assert cfg.memory.kwargs == {"window": 3}
    assert build("memory", cfg.memory).window == 3
    assert load(["memory=summary"]).memory.kwargs["window"] == load([]).memory.window


def test_memory_config_errors_name_the_value():
    with pytest.raises(ConfigError, match="memory=windw: no such option; did you mean memory=window"):
        load(["memory=windw"])
    with pytest.raises(ConfigError, match="memory.window=0: must be >= 1"):
        load(["memory=window", "memory.window=0"])
    with pytest.raises(ConfigError, match="rollout.max_sample_tokens=64: a turn sample needs room"):
        load(["rollout.max_sample_tokens=64", "rollout.max_new_tokens=64"])
    with pytest.raises(UnknownPluginError, match="unknown memory 'nope'"):
        registry("memory").resolve("nope")


# ------------------------------------------------------------------------------------- turn samples: batch
def _episode(replies: list[list[int]], contexts: list[list[int]], rewards: list[float], gid: str) -> Episode:
    """A per-turn episode by hand: replies back to back, one context per turn."""
    traj = Trajectory(task_id=0, seed=0, group_id=gid, initial_observation="start")
    ids, pos = [], 0
    for k, r in enumerate(replies):
        traj.turns.append(Turn(f"r{k}", ParsedAction("action", f"a{k}", True), f"o{k}", rewards[k], False,
                               span=(pos, pos + len(r))))
        ids += r
        pos += len(r)
    return Episode(trajectory=traj, prompt_ids=contexts[0], response_ids=ids, response_mask=[1] * len(ids),
                   logprobs=[-0.1 * (i + 1) for i in range(len(ids))], anchor_obs=[f"s{k}" for k in range(len(replies))],
                   contexts=contexts)


def test_each_turn_is_a_row_with_its_context_its_reply_and_its_share_of_the_reward():
    ep = _episode([[11, 12], [13], [14, 15, 16]], [[1, 2], [1, 2, 3, 4], [5]], [0.0, 0.5, 1.0], "g")
    per_turn = build("allocator", {"name": "per_turn", "kwargs": {}})
    b = build_batch([ep], None, per_turn, pad_token_id=0)
    assert len(b) == 3 and list(b["episode_ids"]) == [ep.uid] * 3 and list(b["group_ids"]) == ["g"] * 3
    assert list(b["uid"]) == [f"{ep.uid}:0", f"{ep.uid}:1", f"{ep.uid}:2"]
    assert b["prompts"].tolist() == [[0, 0, 1, 2], [1, 2, 3, 4], [0, 0, 0, 5]]
    assert b["responses"].tolist() == [[11, 12, 0], [13, 0, 0], [14, 15, 16]]
    assert b["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert b["step_ids"].tolist() == [[0, 0, -1], [1, -1, -1], [2, 2, 2]]
    torch.testing.assert_close(b["rollout_log_probs"][2], torch.tensor([-0.4, -0.5, -0.6]))
    # per_turn: each turn's reward on its own last token; the episode total (1.5) on every row.
    assert b["token_level_scores"].tolist() == [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 1.0]]
    assert list(b["reward"]) == [1.5] * 3 and list(b["num_turns"]) == [3] * 3
    last = build_batch([ep], None, build("allocator", {"name": "last_token", "kwargs": {}}), pad_token_id=0)
    assert last["token_level_scores"].tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.5]]
    gamma = build_batch([ep], None, build("allocator", {"name": "discounted", "kwargs": {"gamma": 0.5}}), 0)
    # Discounted over the episode's agent tokens (6 of them), backwards from the last one.
    want = [[1.5 * 0.5 ** 5, 1.5 * 0.5 ** 4, 0.0], [1.5 * 0.5 ** 3, 0.0, 0.0], [1.5 * 0.25, 1.5 * 0.5, 1.5]]
    torch.testing.assert_close(gamma["token_level_scores"], torch.tensor(want))


# ------------------------------------------------------------------------------------- the real rollout
@pytest.fixture(scope="module")
def relay_parts():
    """A tiny HF model with a tokenizer trained on relay episodes, the react template and a 60-station relay."""
    from openmanus_rl_env_text.relay import RelayEnv

    template = build("template", {"name": "react", "kwargs": {"think": True}})
    env_factory = lambda: RelayEnv(length=60, padding=3, num_tasks=100)  # noqa: E731
    tok = build_tokenizer(tokenizer_corpus(env_factory, template, [{"task_id": i, "seed": 0} for i in range(4)]),
                          vocab_size=400)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return model, tok, template, env_factory


class RecordingEngine(HFEngine):
    """The real HF engine, keeping every prompt it was given."""

    def generate(self, prompts, params):
        self.prompts = getattr(self, "prompts", []) + [list(p) for p in prompts]
        return super().generate(prompts, params)


def test_a_60_turn_window_episode_fits_a_1024_token_sample_budget_without_truncation(relay_parts):
    model, tok, template, env_factory = relay_parts
    cfg = RolloutConfig(max_turns=60, max_new_tokens=24, max_sample_tokens=1024)
    engine = RecordingEngine(model, tok, seed=0)
    loop = AgentLoop(engine, tok, template, env_factory, cfg, memory=memory("window", window=4))
    episodes = loop.run(expand_tasks([{"task_id": 3, "seed": 0}], 2))
    for ep in episodes:
        assert ep.trajectory.num_turns == 60 and ep.trajectory.termination == "max_turns" and not ep.truncated
        assert len(ep.contexts) == 60 and "context_truncated" not in ep.trajectory.info
        assert all(len(c) + cfg.max_new_tokens <= 1024 for c in ep.contexts)
        # The whole episode, as the full memory would hold it, is far beyond the budget.
        full = memory("full").messages("s", ep.trajectory.initial_observation,
                                       [PastTurn(t.response, t.action.content, t.observation) for t in ep.trajectory.turns])
        text = tok.apply_chat_template(full, tokenize=False, add_generation_prompt=True)
        assert len(tok.encode(text, add_special_tokens=False)) > 3 * 1024
    # The engine saw exactly the contexts, one generate call per turn over both episodes.
    assert engine.prompts == [ep.contexts[t] for t in range(60) for ep in episodes]
    batch = build_batch(episodes, None, build("allocator", {"name": "last_token", "kwargs": {}}), tok.pad_token_id)
    assert len(batch) == 120 and int(batch["attention_mask"].sum(-1).max()) <= 1024
    assert len(set(batch["episode_ids"])) == 2 and len(set(batch["uid"])) == 120


def test_the_full_memory_changes_nothing(relay_parts):
    model, tok, template, env_factory = relay_parts
    cfg = RolloutConfig(max_turns=5, max_new_tokens=12, max_response_tokens=512)
    runs = []
    for mem in (None, memory("full")):
        loop = AgentLoop(HFEngine(model, tok, seed=7), tok, template, env_factory, cfg, memory=mem)
        tasks = [{"task_id": 1, "seed": 0, "group_id": "g"}, {"task_id": 1, "seed": 0, "group_id": "g"}]
        eps = loop.run(tasks)
        for e in eps:
            e.uid = "same"
        runs.append((eps, build_batch(eps, None, build("allocator", {"name": "last_token", "kwargs": {}}), 0)))
    (a, ba), (b, bb) = runs
    assert [(e.prompt_ids, e.response_ids, e.response_mask, e.logprobs, e.contexts) for e in a] == \
           [(e.prompt_ids, e.response_ids, e.response_mask, e.logprobs, e.contexts) for e in b]
    assert a[0].contexts == [] and "episode_ids" not in ba and len(ba) == 2
    for key in ba.keys():
        if isinstance(ba[key], torch.Tensor):
            torch.testing.assert_close(ba[key], bb[key], rtol=0, atol=0)
        else:
            assert repr(list(ba[key])) == repr(list(bb[key])), key


def test_the_viewer_shows_each_turn_the_exact_context(relay_parts, tmp_path):
    model, tok, template, env_factory = relay_parts
    cfg = RolloutConfig(max_turns=4, max_new_tokens=12, max_sample_tokens=1024)
    for mem in (memory("window", window=1), memory("full")):
        (ep,) = AgentLoop(HFEngine(model, tok, seed=1), tok, template, env_factory, cfg, memory=mem).run(
            [{"task_id": 2, "seed": 0}])
        rec = episode_record(ep, None, 0, tok)
        for k, turn in enumerate(rec["turns"]):
            ids = ep.contexts[k] if ep.contexts else ep.prompt_ids + ep.response_ids[: ep.trajectory.turns[k].span[0]]
            assert turn["context"] == tok.decode(ids, skip_special_tokens=False)
            assert turn["context_tokens"] == len(ids)
        if ep.contexts:  # window=1: turn 3 shows turn 2's reply, not turn 1's
            assert ep.trajectory.turns[2].response in rec["turns"][3]["context"]
            assert rec["turns"][3]["context"].count("<|im_start|>assistant") == 2
        html = write_html(tmp_path / "t.html", [rec]).read_text()
        assert html.count("context the model saw") == 4 and "&lt;|im_start|&gt;system" in html


def test_a_think_dropping_chat_template_keeps_each_turns_log_probs_exact():
    """With a template that drops earlier <think> blocks, each turn's logged engine log-probs equal the training
    forward pass's (the function the actor uses) on that turn's sample.

    In float32 the two differ by up to ~1e-5 (measured 2.9e-6 to 9.1e-6): the engine decodes one token at a time
    against its KV cache, the training pass runs the whole sample at once, and float32 sums the same products in
    another order. That is the whole cause: in float64 (here) the two agree to the bit on every token measured.
    Both paths cast the float64 logits ``z`` to float32 before ``log_softmax``; a cast may round two nearly equal
    doubles to neighbouring floats, one ulp ``<= eps32 * |z|`` apart, which moves ``z_t`` and ``logsumexp(z)`` (a
    softmax-weighted mean of such moves) by at most ``eps32 * max|z|`` each, and the float32 ``log_softmax`` of
    two inputs that differ adds at most a few ``eps32 * |log p|``. So
    ``|delta log p| <= 2 * eps32 * max|z| + 2 * eps32 * max|log p|`` (~5e-6 here), while a context that differs
    by one token (the dropped thought kept, a shifted turn) moves log-probs by 1e-2 and more."""
    import thinking_model

    from openmanus_rl_core.workers import sequence_logprobs

    model, tok = thinking_model.build()
    model = model.double()
    template = build("template", {"name": "react", "kwargs": {"think": True}})
    cfg = RolloutConfig(max_turns=8, max_new_tokens=32, max_sample_tokens=512)
    loop = AgentLoop(HFEngine(model, tok, seed=0), tok, template, thinking_model.relay_env, cfg,
                     memory=memory("window", window=2))
    episodes = loop.run(expand_tasks([{"task_id": 1, "seed": 0}], 2))
    first = episodes[0].trajectory.turns[0].response
    assert first.startswith(f"<think>{thinking_model.THOUGHT}</think>")  # the model thinks...
    later = tok.decode(episodes[0].contexts[1])
    assert thinking_model.THOUGHT not in later and first.split("</think>")[1] in later  # ...and the template drops it
    batch = build_batch(episodes, None, build("allocator", {"name": "last_token", "kwargs": {}}), tok.pad_token_id)
    with torch.no_grad():
        logp = sequence_logprobs(model, batch, 1.0)[0]
        z_max = float(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.abs().max())
    mask = batch["response_mask"].bool()
    diff = ((logp - batch["rollout_log_probs"]).abs() * mask).amax(-1)
    eps32 = torch.finfo(torch.float32).eps
    bound = 2 * eps32 * z_max + 2 * eps32 * float(logp[mask].abs().max())
    assert len(diff) == 16 and int(mask.sum()) > 100 and bound < 1e-5
    assert float(diff.max()) <= bound, (float(diff.max()), bound)


class RelayRunner:
    """Says the word the newest station shows (``<action>say W</action>``), so every turn moves the runner on and
    every observation differs."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, params):
        from openmanus_rl_core.protocols import Generation

        out = []
        for p in prompts:
            word = self.tok.decode(p).rpartition("shows the word: ")[2].split(".")[0].strip()
            ids = self.tok.encode(f"<action>say {word}</action>", add_special_tokens=False) + [self.tok.eos_token_id]
            assert len(ids) <= params.max_new_tokens
            out.append(Generation(ids, [-0.1] * len(ids), f"<action>say {word}</action>", "stop"))
        return out


@pytest.mark.parametrize("name, kwargs", [("window", {"window": 2}), ("summary", {"window": 1, "max_chars": 200})])
def test_with_a_per_turn_memory_each_turns_anchor_is_the_observation_it_acted_on(relay_parts, name, kwargs):
    from openmanus_rl_env_text.relay import RelayEnv

    _, tok, template, _ = relay_parts
    cfg = RolloutConfig(max_turns=5, max_new_tokens=24, max_sample_tokens=1024)
    loop = AgentLoop(RelayRunner(tok), tok, template, lambda: RelayEnv(length=8, padding=1, num_tasks=10), cfg,
                     memory=memory(name, **kwargs))
    (ep,) = loop.run([{"task_id": 3, "seed": 0}])
    turns = ep.trajectory.turns
    assert len(turns) == 5 and all(t.reward == pytest.approx(1 / 8) for t in turns)  # every turn moved on
    assert ep.anchor_obs == [ep.trajectory.initial_observation] + [t.observation for t in turns[:-1]]
    assert [f"Station {k + 1} of 8." in a for k, a in enumerate(ep.anchor_obs)] == [True] * 5
    # Each turn's context ends with the observation it acted on (its station's word), which is its anchor.
    for k, context in enumerate(ep.contexts):
        word = ep.anchor_obs[k].rpartition("shows the word: ")[2].rstrip(".")
        assert tok.decode(context).rpartition("shows the word: ")[2].startswith(word)
        assert turns[k].action.content == f"say {word}"


@pytest.mark.parametrize("name, kwargs", [("window", {"window": 8}), ("summary", {"window": 6, "max_chars": 400})])
def test_every_turn_sample_fits_max_sample_tokens_even_when_history_must_be_dropped(relay_parts, name, kwargs):
    from openmanus_rl_env_text.relay import RelayEnv

    _, tok, template, _ = relay_parts
    budget, new = 420, 24
    cfg = RolloutConfig(max_turns=12, max_new_tokens=new, max_sample_tokens=budget)
    loop = AgentLoop(RelayRunner(tok), tok, template, lambda: RelayEnv(length=20, padding=3, num_tasks=10), cfg,
                     memory=memory(name, **kwargs))
    (ep,) = loop.run([{"task_id": 1, "seed": 0}])
    info = ep.trajectory.info
    assert ep.trajectory.num_turns == 12 and info.get("context_turns_dropped", 0) > 0  # history was dropped
    assert "context_truncated" not in info and not ep.truncated
    for k, context in enumerate(ep.contexts):
        start, end = ep.trajectory.turns[k].span
        assert len(context) + new <= budget and len(context) + (end - start) <= budget
    # The longest context came close to the budget: dropping kept as much history as fits, not less.
    assert max(map(len, ep.contexts)) > budget - new - 120
    batch = build_batch([ep], None, build("allocator", {"name": "last_token", "kwargs": {}}), tok.pad_token_id)
    assert int(batch["attention_mask"].sum(-1).max()) <= budget
