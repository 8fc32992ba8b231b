"""The group stream: rollouts that keep running across training steps, with a staleness bound
(``rollout.max_staleness``, η, in optimizer steps; docs/async.md).

Two halves:

- :class:`RankStream`, inside each actor rank: a thread runs an :class:`~.episodes.EpisodeRunner` over the groups
  the driver submitted and hands back complete groups. It generates through the rank's engine under the rank's
  engine lock, so new weights (``ActorWorker.sync_rollout_weights``) land between two generate calls: at a turn
  boundary. An episode in flight goes on under the new weights (a partial rollout); every generated token records
  the policy version that produced it (``Episode.versions``).
- :class:`GroupStream`, on the driver: admits groups under :class:`~.staleness.Admission`'s rule
  ``accepted + running <= (η + v + 1)·B``, collects complete groups, drops those the dynamic-sampling filter rejects,
  and gives the trainer its B groups per step. A sample's staleness is ``v - (oldest version among its tokens)``
  (v: optimizer steps completed when it is trained).

No trained sample is staler than η. ``rollout.stale_policy``:

- ``wait`` (default): each step trains B groups: first those admitted η or more versions ago (trained any later,
  they could be staler than η), waiting for any of them still running, then the oldest other complete groups.
  Long episodes are never thrown away, so the trained batch is not biased toward short ones; the price is a wait
  when a straggler is that old. Because training takes complete groups out of admission order, more than B such
  groups can exist in a rare case: the oldest B go, and the others, staler than η at the next step, are dropped
  there (``rollout/groups_dropped``) while that step trains B groups from the rest.
- ``drop``: never waits; a complete group staler than η is discarded (``rollout/groups_dropped``). Faster under long tails,
  but long episodes are the ones dropped: compare ``stream/trained_turns`` with ``stream/generated_turns``.

Either way every complete group is checked at each step before the batch is chosen: one staler than η is dropped
(its place admits another), never trained.

With η > 0 the first batch after a start or resume is the B groups that finished first among the (η + 1)·B
admitted, biased toward short episodes: it carries ``stream/first_batch`` = 1 (0 on every later batch), and the
console's step line says so.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from openmanus_rl_core.rollout.episode import Episode
from openmanus_rl_core.algorithms.dynamic_sampling import dropped_group
from openmanus_rl_core.rollout.staleness import Admission, group_staleness
from openmanus_rl_core.config.schema import RolloutConfig


# ``next_batch(on_groups=...)`` hands complete groups over only once at most this share of the batch's groups
# (and at least one) still plays: before that the ranks' cores are busy generating, and a group's gradient
# computed beside them only slows both down; in the batch's tail they mostly wait on the env, and the gradients
# fill that time.
HANDOVER_RUNNING_SHARE = 0.25


# ------------------------------------------------------------------------------------------------ rank side
class _LockedEngine:
    """The rank's engine as the stream thread sees it: each generate holds the engine lock, and the loop's version
    is read inside it, so the tokens of one call are tagged with the weights that produced them."""

    def __init__(self, engine: Any, lock: threading.RLock, loop: Any, version: Callable[[], int]):
        self.engine, self.lock, self.loop, self.version = engine, lock, loop, version

    def generate(self, prompts, params):
        with self.lock:
            self.loop.version = self.version()
            return self.engine.generate(prompts, params)


class RankStream:
    """One actor rank's side of the stream (see the module doc).

    ``loop``: an :class:`~.loop.AgentLoop` over the rank's engine (mode episodes); ``lock``: the rank's engine lock;
    ``version``: returns the policy version of the engine's weights (read under the lock); ``runner``: another
    runner of that interface (an agent's, gateway/rollout.py), which takes the lock itself.
    """

    def __init__(self, loop: Any, lock: threading.RLock, version: Callable[[], int], runner: Any = None):
        from openmanus_rl_core.rollout.episodes import EpisodeRunner

        if runner is None:
            loop.engine = _LockedEngine(loop.engine, lock, loop, version)
            runner = EpisodeRunner(loop)
        self.runner = runner
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.expected: dict[Any, int] = {}
        self.partial: dict[Any, list[Episode]] = {}
        self.complete: list[list[Episode]] = []
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        # OpenMP's thread count is per thread: a new thread starts at OMP_NUM_THREADS (Ray sets 1), and vLLM's CPU
        # attention fails when its metadata and its kernel see different counts. The stream generates with the
        # rank's own count (trainer.torch_threads); torch._C.set_num_threads sets OpenMP's for the calling thread
        # (vLLM's CPU worker replaces torch.set_num_threads with a no-op once it has bound its threads).
        self.torch_threads = torch.get_num_threads()
        self.thread = threading.Thread(target=self._run, name="omrl-stream", daemon=True)
        self.thread.start()

    def submit(self, groups: Sequence[Sequence[Mapping[str, Any]]]) -> None:
        """Groups to play: each a list of tasks sharing one ``group_id``."""
        for g in groups:
            self.inbox.put(list(g))

    def take(self, max_wait_s: float) -> dict[str, Any]:
        """The groups completed since the last call (waiting up to ``max_wait_s`` for one) and the runner's time
        counters since then: ``{"groups": [[Episode, ...], ...], "stats": {...}}``."""
        with self.cond:
            if not self.complete and self.error is None:
                self.cond.wait(max_wait_s)
            if self.error is not None:
                raise RuntimeError(f"the rollout stream stopped: {self.error!r}") from self.error
            groups, self.complete = self.complete, []
            stats = dict(self.runner.stats)
            for k in stats:
                self.runner.stats[k] = 0 if isinstance(stats[k], int) else 0.0
        return {"groups": groups, "stats": stats}

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        self.runner.close()

    def _run(self) -> None:
        torch._C.set_num_threads(self.torch_threads)
        try:
            while not self.stopping.is_set():
                while True:
                    try:
                        group = self.inbox.get_nowait()
                    except queue.Empty:
                        break
                    self.expected[group[0]["group_id"]] = len(group)
                    self.runner.add(group)
                if not self.runner.busy:
                    time.sleep(0.005)
                    continue
                for ep in self.runner.advance(max_wait_s=0.02):
                    gid = ep.group_id
                    eps = self.partial.setdefault(gid, [])
                    eps.append(ep)
                    if len(eps) == self.expected[gid]:
                        del self.partial[gid], self.expected[gid]
                        with self.cond:
                            self.complete.append(eps)
                            self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001  (surfaced at the driver's next take)
            with self.cond:
                self.error = exc
                self.cond.notify_all()


# ---------------------------------------------------------------------------------------------- driver side
class _Group:
    __slots__ = ("gid", "tasks", "admitted", "rank", "episodes")

    def __init__(self, gid: str, tasks: list[dict], admitted: int, rank: int):
        self.gid, self.tasks, self.admitted, self.rank = gid, tasks, admitted, rank
        self.episodes: list[Episode] = []


class GroupStream:
    """The driver's side of the stream (see the module doc).

    ``actor``: the actor worker group (methods ``stream_start``, ``stream_submit``, ``stream_take``,
    ``stream_stop``); ``next_tasks()``: the next batch of task rows (the trainer's sampler; each row becomes one
    group of ``n``); ``batch_groups``: B; ``accept(trajectories) -> bool``: the dynamic-sampling filter (None: keep
    every group); ``max_extra_groups``: how many rejected groups one step may replace before it trains on fewer;
    ``abandon()``: true once the run stops (:class:`~openmanus_rl_core.process.stopping.Abandoned` is raised).
    """

    def __init__(self, actor: Any, cfg: RolloutConfig, next_tasks: Callable[[], list[dict]], batch_groups: int,
                 accept: Callable[[list[Episode]], bool] | None = None, max_extra_groups: int = 0,
                 expand: Callable[[list[dict], int], list[dict]] | None = None,
                 abandon: Callable[[], bool] = lambda: False):
        from openmanus_rl_core.rollout.tasks import expand_tasks

        self.actor = actor
        self.cfg = cfg
        self.eta = int(cfg.max_staleness or 0)
        self.wait = cfg.stale_policy == "wait"
        self.next_tasks = next_tasks
        self.B = int(batch_groups)
        self.n = int(cfg.n)
        self.accept = accept
        self.max_extra_groups = int(max_extra_groups)
        self.expand = expand or expand_tasks
        self.abandon = abandon  # a stop signal: next_batch gives up (the groups in flight stay in state_dict)
        self.admission = Admission(self.B, self.eta)
        self.queue: list[dict] = []  # task rows drawn from the sampler, not yet admitted
        self.running: dict[str, _Group] = {}
        self.ready: list[_Group] = []
        self.counter = 0
        self.started = False
        self.batches = 0  # returned since this stream was built or restored: the first is marked stream/first_batch
        self.dropped: list[dict] = []  # groups finished and left out since the trainer last took them (why: reason)

    # ---------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """What a checkpoint keeps: the task rows of every group admitted but not yet trained (they are played
        again from their start after a resume), then those drawn but not admitted, and the id counter."""
        groups = sorted([*self.running.values(), *self.ready], key=lambda g: g.admitted)
        rows = [{k: v for k, v in g.tasks[0].items() if k not in ("group_id", "sample_index")} for g in groups]
        return {"queue": rows + list(self.queue), "counter": self.counter}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.queue = [dict(t) for t in state.get("queue", [])]
        self.counter = int(state.get("counter", 0))
        self.batches = 0

    # ------------------------------------------------------------------------------------------------ step
    def next_batch(self, version: int, metrics: dict[str, float],
                   on_groups: Callable[[list[Episode]], None] | None = None) -> list[Episode]:
        """The episodes of the (at most B) groups to train at policy version ``version`` (optimizer steps
        completed).

        ``on_groups(episodes)`` (η=0 only: then every accepted group is trained at this version): called with the
        episodes of the groups accepted since its last call, while the others still play, once at most
        :data:`HANDOVER_RUNNING_SHARE` of the batch's groups are running (``rollout.overlap_update``)."""
        if on_groups is not None and self.eta != 0:
            raise ValueError(f"on_groups needs max_staleness=0, not {self.eta}: at a larger one the batch is "
                             f"chosen only once the step's groups are in")
        adm = self.admission
        handed: set[str] = set()
        if not self.started:
            self.actor.call("stream_start")
            self.started = True
            adm.begin(version)
        adm.version = version
        stats: Counter = Counter()
        filtered = dropped = 0
        generated_turns: list[int] = []
        t0 = time.perf_counter()
        while True:
            if self.abandon():
                from openmanus_rl_core.process.stopping import Abandoned

                raise Abandoned("the rollout stream's batch abandoned: the run is stopping")
            if filtered < self.max_extra_groups or filtered == 0:
                self._admit(version)
            for rank_out in self.actor.call("stream_take", max_wait_s=0.05):
                stats.update(rank_out["stats"])
                for eps in rank_out["groups"]:
                    g = self.running.pop(eps[0].group_id)
                    g.episodes = eps
                    generated_turns += [e.trajectory.num_turns for e in eps]
                    ok = self.accept is None or self.accept([e.trajectory for e in eps])
                    adm.finish(accepted=ok)
                    if ok:
                        self.ready.append(g)
                    else:
                        filtered += 1
                        self.dropped.append(dropped_group(eps, "no_spread"))
            # A complete group staler than eta can never be trained: dropped once seen, its place admits another.
            keep = [g for g in self.ready if self._staleness(g, version) <= self.eta]
            self.dropped += [dropped_group(g.episodes, "stale") for g in self.ready if g not in keep]
            dropped += self._drop(len(self.ready) - len(keep))
            self.ready = keep
            fresh = [g for g in self.ready if g.gid not in handed] if on_groups is not None else []
            if fresh and len(self.running) <= max(1.0, HANDOVER_RUNNING_SHARE * self.B):
                handed.update(g.gid for g in fresh)
                on_groups([e for g in fresh for e in g.episodes])
            if self.wait and any(self._urgent(g, version) for g in self.running.values()):
                continue  # a group that must be trained now is still running
            if len(self.ready) >= self.B:
                break
            if not self.running and (filtered >= self.max_extra_groups or not adm.can_admit()):
                break  # the refill is used up (or nothing more may start): train on what was accepted
        # The groups that must go now first (at most B of them: the admission rule), then the oldest others.
        self.ready.sort(key=lambda g: (not self._urgent(g, version), g.admitted, g.gid))
        batch, self.ready = self.ready[:self.B], self.ready[self.B:]  # none staler than eta: dropped in the loop
        if handed - {g.gid for g in batch}:
            raise RuntimeError(f"groups handed to on_groups were left out of the batch at version {version}: "
                               f"{sorted(handed - {g.gid for g in batch})}")
        adm.consume(len(batch))
        if not batch:
            raise RuntimeError(f"the rollout stream has no group to train at version {version}: {filtered} "
                               f"filtered, {dropped} dropped, {len(self.running)} running")
        episodes = [e for g in batch for e in g.episodes]
        metrics.update(self._metrics(batch, version, stats, filtered, dropped, generated_turns,
                                     wait_s=time.perf_counter() - t0))
        self.batches += 1
        return episodes

    def close(self) -> None:
        if self.started:
            self.actor.call("stream_stop")
            self.started = False

    # ----------------------------------------------------------------------------------------------- parts
    def _urgent(self, g: _Group, version: int) -> bool:
        """Admitted ``η`` or more versions ago: trained later, it could be staler than ``η``."""
        return g.admitted <= version - self.eta

    def _drop(self, n: int) -> int:
        """``n`` accepted groups thrown away as too stale: their places in the admission window are free again."""
        self.admission.accepted -= n
        return n

    def _admit(self, version: int) -> None:
        per_rank: list[list[list[dict]]] = [[] for _ in range(self.actor.size)]
        load = Counter(g.rank for g in self.running.values())
        while self.admission.can_admit():
            if not self.queue:
                self.queue = list(self.next_tasks())
            row = self.queue.pop(0)
            gid = f"s{self.counter}"
            self.counter += 1
            tasks = self.expand([dict(row, group_id=gid)], self.n)
            rank = min(range(self.actor.size), key=lambda r: (load[r], r))
            load[rank] += 1
            self.running[gid] = _Group(gid, tasks, version, rank)
            per_rank[rank].append(tasks)
            self.admission.start()
        if any(per_rank):
            self.actor.call_each("stream_submit", [(groups,) for groups in per_rank])

    @staticmethod
    def _staleness(g: _Group, version: int) -> int:
        return group_staleness([e.versions for e in g.episodes], version)

    def _metrics(self, batch: list[_Group], version: int, stats: Mapping[str, float], filtered: int, dropped: int,
                 generated_turns: list[int], wait_s: float) -> dict[str, float]:
        stale = [self._staleness(g, version) for g in batch for _ in g.episodes]
        lags: Counter = Counter(version - v for g in batch for e in g.episodes for v in e.versions if v >= 0)
        tokens = sum(lags.values()) or 1
        trained_turns = [e.trajectory.num_turns for g in batch for e in g.episodes]
        out = {
            "stream/staleness_mean": sum(stale) / len(stale) if stale else 0.0,
            "stream/staleness_max": float(max(stale, default=0)),
            "rollout/groups_filtered": float(filtered),
            "rollout/groups_dropped": float(dropped),
            "stream/groups": float(len(batch)),
            "stream/running": float(len(self.running)),
            "stream/trained_turns": sum(trained_turns) / len(trained_turns) if trained_turns else 0.0,
            "stream/generated_turns": (sum(generated_turns) / len(generated_turns) if generated_turns else 0.0),
            "timing/stream_wait": wait_s,
            "timing/env_wait": float(stats.get("env_wait_s", 0.0)),
            "timing/generate": float(stats.get("gen_s", 0.0)),
            # The first batch is the B groups of (η + 1)·B that finished first: the short, often easy episodes.
            "stream/first_batch": float(self.batches == 0 and self.eta > 0),
        }
        for k in range(self.eta + 1):
            out[f"stream/staleness_share/{k}"] = sum(1 for s in stale if s == k) / len(stale) if stale else 0.0
            out[f"stream/token_share/{k}"] = lags.get(k, 0) / tokens
        return out
