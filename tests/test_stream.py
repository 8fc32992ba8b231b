"""The rollout stream's parts with hand-computed numbers: the decoupled loss and its TIS cap, admission on a
simulated clock, dynamic sampling, and the policy version every generated token records."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from openmanus_rl_core.algorithms import policy_loss
from openmanus_rl_core.algorithms.correction import truncated_is_weights
from openmanus_rl_core.algorithms.dynamic_sampling import GroupFilter, has_spread, keep_groups
from openmanus_rl_core.rollout.staleness import Admission, group_staleness
from openmanus_rl_core.rollout.stream import GroupStream
from openmanus_rl_core.config.schema import RolloutConfig

LOG = math.log
PROX = torch.tensor([[LOG(0.5), LOG(0.2), LOG(0.9), 0.0]])
BEHAV = torch.tensor([[LOG(0.25), LOG(0.4), LOG(0.3), 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


# ------------------------------------------------------------------------------------------ the correction
def test_truncated_importance_weights_by_hand():
    w, m = truncated_is_weights(PROX, BEHAV, MASK, cap=2.0)
    # pi_prox / pi_behav = 2.0, 0.5, 3.0 -> capped at 2: 2.0, 0.5, 2.0; 0 off the mask.
    assert w.tolist()[0] == pytest.approx([2.0, 0.5, 2.0, 0.0])
    assert m["actor/tis_weight_mean"] == pytest.approx((2.0 + 0.5 + 3.0) / 3)
    assert m["actor/tis_capped_frac"] == pytest.approx(1 / 3)
    assert m["actor/behav_prox_kl"] == pytest.approx((LOG(0.5) + LOG(2.0) + LOG(1 / 3)) / 3)
    with pytest.raises(ValueError, match="0.5"):
        truncated_is_weights(PROX, BEHAV, MASK, cap=0.5)


def test_the_decoupled_loss_clips_on_the_proximal_policy_and_weighs_by_the_capped_ratio():
    """Per token: w * max(-A r, -A clip(r, 0.8, 1.28)), r = pi_theta / pi_prox; token mean over the mask."""
    logp = torch.tensor([[LOG(0.6), LOG(0.2), LOG(1.35), 0.0]], requires_grad=True)  # r = 1.2, 1.0, 1.5
    adv = torch.tensor([[1.0, -1.0, 1.0, 0.0]])
    w, _ = truncated_is_weights(PROX, BEHAV, MASK, cap=2.0)
    loss, _ = policy_loss(PROX, logp, adv * w, MASK, clip_low=0.2, clip_high=0.28)
    # token 1: 2 * max(-1.2, -1.2) = -2.4; token 2: 0.5 * max(1.0, 1.0) = 0.5; token 3: 2 * max(-1.5, -1.28) = -2.56
    assert float(loss.detach()) == pytest.approx((-2.4 + 0.5 - 2.56) / 3, abs=1e-6)
    loss.backward()
    # d/dlogp of w * (-A r) is -w A r on unclipped tokens, 0 where the clip is active (token 3).
    assert logp.grad.tolist()[0] == pytest.approx([-2 * 1.2 / 3, 0.5 * 1.0 / 3, 0.0, 0.0], abs=1e-6)


# ---------------------------------------------------------------------------------------- dynamic sampling
def _traj(success: bool):
    return SimpleNamespace(success=success, num_turns=1)


def test_groups_without_spread_are_dropped():
    assert not has_spread([1.0, 1.0, 1.0]) and not has_spread([0.3]) and has_spread([0.0, 0.0, 1.0])
    by_success = GroupFilter(composer=None, metric="success")
    assert by_success([_traj(True), _traj(False)]) and not by_success([_traj(True), _traj(True)])
    composer = SimpleNamespace(compose_batch=lambda trajs: ([SimpleNamespace(total=t.score) for t in trajs], {}))
    by_reward = GroupFilter(composer, metric="reward")
    assert not by_reward([SimpleNamespace(score=0.5)] * 3)
    assert by_reward([SimpleNamespace(score=0.5), SimpleNamespace(score=0.25)])
    eps = [SimpleNamespace(group_id=g, trajectory=_traj(s))
           for g, s in [("a", True), ("a", True), ("b", True), ("b", False), ("c", False), ("c", False)]]
    kept, dropped = keep_groups(eps, by_success)
    assert [e.group_id for e in kept] == ["b", "b"] and [[e.group_id for e in g] for g in dropped] == [["a", "a"],
                                                                                                     ["c", "c"]]
    with pytest.raises(ValueError, match="'accuracy'"):
        GroupFilter(None, metric="accuracy")


# --------------------------------------------------------------------------- the stream on a simulated clock
class SimActor:
    """The actor group as the stream sees it, on a simulated clock: one tick per ``stream_take``. Each episode has
    a seeded number of turns, each turn a heavy-tailed number of ticks; a turn's tokens record the version of the
    weights when it was generated (at the turn's start). ``succeed(gid, i)`` decides each episode's success."""

    size = 2

    def __init__(self, seed: int, succeed=lambda gid, i: i % 2 == 0):
        self.rng = random.Random(seed)
        self.version = 0
        self.succeed = succeed
        self.running: list[dict] = []
        self.complete: list[list] = []  # finished groups not yet taken
        self.submitted = 0

    def call(self, method, **kw):
        if method == "stream_take":
            self._tick()
            out, self.complete = self.complete, []
            return [{"groups": out, "stats": {"env_wait_s": 0.0, "gen_s": 0.0}}, {"groups": [], "stats": {}}]
        return [None] * self.size

    def call_each(self, method, args):
        assert method == "stream_submit"
        for (groups,) in args:
            for tasks in groups:
                self.submitted += 1
                eps = []
                for i, t in enumerate(tasks):
                    turns = self.rng.randint(1, 4)
                    eps.append(SimpleNamespace(group_id=t["group_id"], versions=[], turns_left=turns, wait=0,
                                               trajectory=SimpleNamespace(num_turns=turns, task=t,
                                                                          success=self.succeed(t["group_id"], i))))
                self.running.append({"eps": eps})

    def advance(self, ticks: int) -> None:
        for _ in range(ticks):
            self._tick()

    def _tick(self) -> None:
        done = []
        for g in self.running:
            for e in g["eps"]:
                if e.turns_left and e.wait == 0:  # the turn starts: 3 tokens under the current weights
                    e.versions += [self.version] * 3 + [-1, -1]
                    e.wait = 1 + int(self.rng.lognormvariate(0, 1.2))
                if e.turns_left:
                    e.wait -= 1
                    if e.wait == 0:
                        e.turns_left -= 1
            if all(e.turns_left == 0 for e in g["eps"]):
                done.append(g)
        self.running = [g for g in self.running if g not in done]
        self.complete += [g["eps"] for g in done]


def _tasks(counter=iter(range(10**6))):
    return [{"task_id": next(counter), "seed": 0} for _ in range(4)]


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_admission_bound_and_staleness_on_a_simulated_clock(eta, policy):
    B, steps = 4, 12
    actor = SimActor(seed=eta)
    cfg = RolloutConfig(n=3, max_staleness=eta, stale_policy=policy)
    stream = GroupStream(actor, cfg, _tasks, B)
    original_submit = actor.call_each
    checks = []

    def submit(method, args):  # the admission rule, checked from outside: admitted <= (eta + v + 1) * B
        original_submit(method, args)
        checks.append((actor.submitted, (eta + actor.version + 1) * B, v))

    actor.call_each = submit
    trained = 0
    dropped = []  # groups thrown away as too stale, through each step (their places are free again)
    for v in range(steps):
        metrics: dict = {}
        eps = stream.next_batch(v, metrics)
        dropped.append((dropped[-1] if dropped else 0) + int(metrics["rollout/groups_dropped"]))
        groups = {e.group_id for e in eps}
        trained += len(groups)
        for gid in groups:  # no trained sample is staler than eta
            assert group_staleness([e.versions for e in eps if e.group_id == gid], v) <= eta
        assert metrics["stream/staleness_max"] <= eta
        assert len(groups) <= B
        if policy == "wait":
            assert len(groups) == B and metrics["rollout/groups_dropped"] == 0
        actor.advance(3)  # the update takes 3 ticks, generation goes on under the old weights
        actor.version = v + 1  # the weight sync
    assert all(sub <= cap + dropped[step] for sub, cap, step in checks), (checks, dropped)
    assert trained >= (steps - 1) * B


def test_the_stream_overlaps_generation_with_training():
    """With eta=2, samples generated during the previous update are trained: staleness 1 or 2 appears."""
    actor = SimActor(seed=3)
    stream = GroupStream(actor, RolloutConfig(n=2, max_staleness=2), _tasks, 4)
    seen = set()
    for v in range(10):
        metrics: dict = {}
        stream.next_batch(v, metrics)
        seen |= {k for k in range(3) if metrics[f"stream/staleness_share/{k}"] > 0}
        actor.advance(4)
        actor.version = v + 1
    assert seen & {1, 2}


def test_dynamic_sampling_in_the_stream_keeps_only_groups_with_spread_and_bounds_the_refill():
    # Groups whose id ends in an even number succeed everywhere (no spread); the others half the time.
    succeed = lambda gid, i: int(gid[1:]) % 2 == 0 or i % 2 == 0  # noqa: E731
    actor = SimActor(seed=1, succeed=succeed)
    accept = GroupFilter(None, metric="success")
    B, extra = 4, 3
    stream = GroupStream(actor, RolloutConfig(n=2, max_staleness=1), _tasks, B, accept=accept, max_extra_groups=extra)
    for v in range(6):
        metrics: dict = {}
        eps = stream.next_batch(v, metrics)
        groups: dict = {}
        for e in eps:
            groups.setdefault(e.group_id, []).append(e.trajectory)
        assert groups and all(accept(t) for t in groups.values())  # zero-variance groups never reach the loss
        assert all(int(g[1:]) % 2 == 1 for g in groups)
        assert metrics["rollout/groups_filtered"] <= extra + (1 + v + 1) * B  # bounded refill
        actor.advance(2)
        actor.version = v + 1
    # Admitted groups: at most one refill of `extra` per step beyond the (eta + v + 1) * B window.
    assert actor.submitted <= (1 + 6 + 1) * B + 6 * extra


class ScriptedActor:
    """The actor group as the stream sees it, scripted: group ``gid`` completes at the ``ticks.get(gid, 1)``-th
    ``stream_take`` after its submission (one tick per take), every token of it under the version current at its
    submission (``version``, set by the test as the weight sync would)."""

    size = 1

    def __init__(self, ticks: dict[str, int]):
        self.ticks = ticks
        self.version = 0
        self.running: list[list] = []  # [takes left, episodes]

    def call(self, method, **kw):
        if method != "stream_take":
            return [None]
        for g in self.running:
            g[0] -= 1
        done = [eps for left, eps in self.running if left == 0]
        self.running = [g for g in self.running if g[0] > 0]
        return [{"groups": done, "stats": {}}]

    def call_each(self, method, args):
        assert method == "stream_submit"
        for (groups,) in args:
            for tasks in groups:
                gid = tasks[0]["group_id"]
                eps = [SimpleNamespace(group_id=gid, versions=[self.version] * 3,
                                       trajectory=SimpleNamespace(num_turns=1, success=True, task=tasks[0]))
                       for _ in tasks]
                self.running.append([self.ticks.get(gid, 1), eps])


def _scripted_steps(ticks: dict[str, int], steps: int, B: int = 2, eta: int = 2) -> list[tuple[list, dict]]:
    """``steps`` batches of a stream (B groups of 2, eta, the wait policy) over :class:`ScriptedActor`: each
    step's trained groups, sorted, and its metrics; every trained group is checked against eta on its own."""
    actor = ScriptedActor(ticks)
    stream = GroupStream(actor, RolloutConfig(n=2, max_staleness=eta), _tasks, B)
    out = []
    for v in range(steps):
        actor.version = v
        metrics: dict = {}
        eps = stream.next_batch(v, metrics)
        gids = sorted({e.group_id for e in eps})
        for gid in gids:
            assert group_staleness([e.versions for e in eps if e.group_id == gid], v) <= eta, (v, gid)
        assert metrics["stream/staleness_max"] <= eta
        # each group left out is recorded once, with why (the trainer takes them into the step's dropped file)
        assert len(stream.dropped) == metrics["rollout/groups_dropped"]
        metrics["dropped"], stream.dropped = [(d["group_id"], d["reason"], d["samples"]) for d in stream.dropped], []
        out.append((gids, metrics))
    return out


def test_more_than_b_urgent_groups_train_none_staler_than_eta_and_count_the_extra_as_dropped():
    """B=2, eta=2: s0..s5 start at version 0, s0-s2 run 3 takes, the rest 1. Version 0 trains s3, s4; version 1
    the oldest complete, s5, and s6 (started at 1); at version 2 three groups started at 0 are urgent: the oldest
    two go, and s2, 3 versions old at version 3, is dropped there (counted once) and never trained; the step
    still trains B groups, from those ready."""
    steps = _scripted_steps({"s0": 3, "s1": 3, "s2": 3, "s8": 2, "s9": 2}, steps=5)
    trained = [gids for gids, _ in steps]
    dropped = [m["rollout/groups_dropped"] for _, m in steps]
    assert trained[:3] == [["s3", "s4"], ["s5", "s6"], ["s0", "s1"]]
    assert [m["stream/staleness_max"] for _, m in steps[:3]] == [0.0, 1.0, 2.0]
    assert dropped == [0.0, 0.0, 0.0, 1.0, 0.0] and steps[3][1]["dropped"] == [("s2", "stale", 2)]
    assert all(len(gids) == 2 for gids in trained)
    assert "s2" not in {g for gids in trained for g in gids}


def test_stale_leftovers_do_not_empty_a_step_while_fresh_groups_are_ready():
    """B=2, eta=2, four groups started at version 0 outlast versions 0 and 1: at version 2 the oldest two go, and
    at version 3 the other two are 3 versions old. They are dropped (2), and the step trains the fresh groups that
    are ready instead (before, it took the two stale ones, dropped both, and failed with no group to train)."""
    steps = _scripted_steps({"s0": 3, "s1": 3, "s2": 3, "s3": 3, "s8": 2, "s9": 2}, steps=5)
    trained = [gids for gids, _ in steps]
    assert trained[2] == ["s0", "s1"]
    assert [m["rollout/groups_dropped"] for _, m in steps] == [0.0, 0.0, 0.0, 2.0, 0.0]
    assert all(len(gids) == 2 for gids in trained)
    assert not {"s2", "s3"} & {g for gids in trained for g in gids}


def test_admission_rule_counts():
    adm = Admission(batch_groups=2, max_staleness=1)
    for _ in range(4):  # (1 + 0 + 1) * 2
        adm.start()
    assert not adm.can_admit()
    with pytest.raises(RuntimeError, match="capacity 4"):
        adm.start()
    adm.finish(accepted=False)  # a rejected group frees its place
    assert adm.can_admit()
    adm.start()
    adm.finish(accepted=True)
    adm.version = 1
    assert adm.capacity == 6 and adm.accepted + adm.running == 4


# ----------------------------------------------------------------------------- versions on generated tokens
def test_each_token_records_the_version_that_generated_it_across_a_weight_update():
    """A partial rollout: the first reply is generated under version 0, then new weights (version 1) land at the
    turn boundary; the second reply's tokens record 1, the first's keep 0, observation tokens -1."""
    from openmanus_rl_core.plugin.registry import build, registry
    from openmanus_rl_core.rollout import AgentLoop, expand_tasks
    from openmanus_rl_core.rollout.stream import _LockedEngine
    from openmanus_rl_core.rollout.episodes import EpisodeRunner
    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.testing.envs import _OracleEngine

    import threading

    tokenizer = build_tokenizer(["open box", "say apple", "The box is open. The note says: apple."] * 5,
                                vocab_size=300)
    template = build("template", {"name": "react", "kwargs": {}})
    envs: list = []

    def factory():
        envs.append(registry("env").build("key_door"))
        return envs[-1]

    state = {"v": 0}

    class Bumping(_OracleEngine):
        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            state["v"] += 1  # a weight sync right after this call
            return out

    loop = AgentLoop(Bumping(tokenizer, template, envs), tokenizer, template, factory,
                     RolloutConfig(max_new_tokens=64, max_turns=4))
    loop.engine = _LockedEngine(loop.engine, threading.RLock(), loop, lambda: state["v"])
    (ep,) = EpisodeRunner(loop).run(expand_tasks([{"task_id": 0, "seed": 0}], 1))
    assert ep.trajectory.success and ep.trajectory.num_turns == 2
    (a0, a1), (b0, b1) = ep.trajectory.turns[0].span, ep.trajectory.turns[1].span
    assert set(ep.versions[a0:a1]) == {0} and set(ep.versions[b0:b1]) == {1}
    assert set(ep.versions[a1:b0]) == {-1}  # the observation between the replies
    assert len(ep.versions) == len(ep.response_ids)
    assert ep.oldest_version == 0 and group_staleness([ep.versions], 2) == 2


def _omp_threads():
    """OpenMP's thread count of the calling thread, read from the libgomp torch loaded (what vLLM's CPU kernels
    read; torch.get_num_threads() answers from torch's own global and does not show it)."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line})
    if not paths:
        pytest.skip("torch here is not built with OpenMP")
    return ctypes.CDLL(paths[0]).omp_get_max_threads()


def test_the_stream_thread_generates_with_the_ranks_thread_count():
    """A new thread starts at OMP_NUM_THREADS (Ray sets 1) whatever the rank set; the stream's generation must run
    at the rank's count (vLLM's CPU attention fails on a mismatch: `thread_num 2 vs 1`)."""
    import threading

    import torch

    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.plugin.registry import build, registry
    from openmanus_rl_core.rollout import AgentLoop
    from openmanus_rl_core.rollout.stream import RankStream
    from openmanus_rl_core.testing.envs import _OracleEngine

    tokenizer = build_tokenizer(["open box", "say apple", "The box is open. The note says: apple."] * 5,
                                vocab_size=300)
    template = build("template", {"name": "react", "kwargs": {}})
    envs: list = []
    seen: list[int] = []

    def factory():
        envs.append(registry("env").build("key_door"))
        return envs[-1]

    class Counting(_OracleEngine):
        def generate(self, prompts, params):
            seen.append(_omp_threads())
            return super().generate(prompts, params)

    before = torch.get_num_threads()
    fresh: list[int] = []  # what a new thread starts with
    t = threading.Thread(target=lambda: fresh.append(_omp_threads()))
    t.start(), t.join()
    rank = fresh[0] + 1
    torch.set_num_threads(rank)  # the rank's count, set on its main thread as the workers do
    try:
        loop = AgentLoop(Counting(tokenizer, template, envs), tokenizer, template, factory,
                         RolloutConfig(max_new_tokens=64, max_turns=4, mode="episodes"))
        stream = RankStream(loop, threading.RLock(), lambda: 0)
        try:
            stream.submit([[{"task_id": 0, "seed": 0, "group_id": "g0"}]])
            got = stream.take(max_wait_s=30)
        finally:
            stream.stop()
    finally:
        torch.set_num_threads(before)
    assert len(got["groups"]) == 1
    assert seen and set(seen) == {rank}, (seen, fresh)


def test_a_stream_resumed_at_a_later_version_admits_one_window_not_all_earlier_steps():
    """Resumed at version 5 (a checkpoint), the stream admits (eta + 1) * B groups, as at version 0, and nothing it
    trains is staler than eta."""
    B, eta = 4, 1
    actor = SimActor(seed=9)
    stream = GroupStream(actor, RolloutConfig(n=2, max_staleness=eta), _tasks, B)
    actor.version = 5
    for v in range(5, 9):
        metrics: dict = {}
        eps = stream.next_batch(v, metrics)
        if v == 5:
            assert actor.submitted <= (eta + 1) * B + B  # one window, plus what freed up as groups completed
        assert metrics["stream/staleness_max"] <= eta and metrics["rollout/groups_dropped"] == 0
        assert len({e.group_id for e in eps}) == B
        actor.advance(3)
        actor.version = v + 1


def test_the_first_batch_after_a_start_or_a_resume_is_marked():
    """With eta > 0 a stream's first batch is the B groups that finished first of the (eta + 1) * B it admitted:
    ``stream/first_batch`` is 1 for it, 0 after; a stream restored from a checkpoint marks its first batch again.
    With eta = 0 the first batch is every admitted group, so nothing is marked."""
    def marks(stream, actor, versions):
        out = []
        for v in versions:
            metrics: dict = {}
            stream.next_batch(v, metrics)
            out.append(metrics["stream/first_batch"])
            actor.advance(3)
            actor.version = v + 1
        return out

    actor = SimActor(seed=4)
    stream = GroupStream(actor, RolloutConfig(n=2, max_staleness=1), _tasks, 4)
    assert marks(stream, actor, range(3)) == [1.0, 0.0, 0.0]
    resumed_actor = SimActor(seed=5)
    resumed_actor.version = 3
    resumed = GroupStream(resumed_actor, RolloutConfig(n=2, max_staleness=1), _tasks, 4)
    resumed.load_state_dict(stream.state_dict())
    assert marks(resumed, resumed_actor, range(3, 5)) == [1.0, 0.0]
    on_policy_actor = SimActor(seed=6)
    on_policy = GroupStream(on_policy_actor, RolloutConfig(n=2, max_staleness=0), _tasks, 4)
    assert marks(on_policy, on_policy_actor, range(2)) == [0.0, 0.0]


@pytest.mark.parametrize("correction, engine_is_old", [("behaviour", True), ("off", False), ("tis", False)])
def test_the_stream_default_takes_the_ppo_ratio_against_the_engine_log_probs(correction, engine_is_old):
    """algorithm.rollout_correction=behaviour (auto in the stream): old_log_probs are the engine's sampling
    log-probs, so the PPO clip bounds how far an update moves from the policy that sampled."""
    from openmanus_rl_core.algorithms.correction import correction_mode
    from openmanus_rl_core.config.schema import AlgorithmConfig
    from openmanus_rl_core.run.trainer import Trainer

    stream, plain = RolloutConfig(max_staleness=2), RolloutConfig()
    assert correction_mode(AlgorithmConfig(), stream) == "behaviour"
    assert correction_mode(AlgorithmConfig(), plain) == "off"
    assert correction_mode(AlgorithmConfig(rollout_correction="tis"), plain) == "tis"
    algo = AlgorithmConfig(rollout_correction=correction)
    owner = SimpleNamespace(algo=algo, old_log_probs_mode="auto", correction=correction_mode(algo, stream),
                            cfg=SimpleNamespace(actor=SimpleNamespace(ppo_mini_batch_size=None, ppo_epochs=1)))
    batch = {"rollout_log_probs": BEHAV.clone(), "response_mask": MASK.clone()}
    Trainer.phase_log_probs(owner, batch, {})
    assert ("old_log_probs" in batch) == engine_is_old
    if engine_is_old:
        assert torch.equal(batch["old_log_probs"], BEHAV)
