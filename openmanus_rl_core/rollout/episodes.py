"""Episodes that advance on their own (``rollout.mode=episodes``).

In lockstep (:meth:`AgentLoop.run`), every turn waits for its slowest env call and the rollout for its slowest
episode. Here each episode moves on as soon as its own env call returns:

- every env call (reset, step) runs on :class:`EnvCallPool`'s threads (``rollout.env_workers`` bounds them) with
  its own ``env_timeout_s``;
- the engine generates for whichever episodes are ready: the runner gathers ready episodes until
  ``rollout.gen_batch_size`` of them are waiting (0: every ready one) or ``rollout.gen_wait_ms`` passed since the
  first became ready, then makes ONE batched ``generate`` over them (an engine that batches by itself, such as
  vLLM, gets the same requests);
- the token layout, the per-turn memories, the termination reasons and the math are exactly the loop's (the same
  :class:`AgentLoop` methods build them); only the order of the generate calls differs, so sampled tokens differ
  from a lockstep run with the same seed.

:class:`EpisodeRunner` is incremental: :meth:`add` starts episodes at any time and :meth:`advance` runs one round
of harvesting env calls and generating, returning the episodes that finished. :meth:`run` is one step's rollout;
the group stream (:mod:`.stream`) keeps one runner alive across training steps.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from openmanus_rl_core.rollout.env_pool import CallStatus, EnvCallPool, describe_error
from openmanus_rl_core.rollout.episode import Episode, LiveEpisode


class EpisodeRunner:
    """Runs episodes of one :class:`AgentLoop` (its engine, template, env factory, memory and config) without
    lockstep; see the module doc.

    ``stats`` (reset by :meth:`run`, cumulative otherwise): ``generate_calls``, ``gen_s`` (seconds inside
    ``generate``), ``env_wait_s`` (seconds the runner waited with no episode ready to generate), ``gen_rows``
    (episodes generated for, summed over calls). Each finished episode's ``trajectory.info["env_s"]`` is its own
    env time (reset + steps).
    """

    def __init__(self, loop: Any):  # the AgentLoop (rollout/loop.py) whose parts it runs
        self.loop = loop
        self.cfg = loop.cfg
        self.pool = EnvCallPool(self.cfg.env_workers)
        self.params = loop._params()
        self.calls: dict[cf.Future, tuple[LiveEpisode, Any]] = {}  # env call -> (episode, its Turn; None for reset)
        self.ready: deque[LiveEpisode] = deque()  # episodes whose next reply can be generated
        self.closing: list[tuple[cf.Future, LiveEpisode]] = []
        self.live = 0
        self.stats: dict[str, Any] = self._new_stats()

    @staticmethod
    def _new_stats() -> dict[str, Any]:
        return {"generate_calls": 0, "gen_s": 0.0, "env_wait_s": 0.0, "gen_rows": 0}

    # ------------------------------------------------------------------------------------------------ public
    def add(self, tasks: Sequence[Mapping[str, Any]]) -> list[Episode]:
        """Start one episode per task (reset submitted at once); returns them, still running."""
        lives = [self.loop._new_live(t) for t in tasks]
        for lv in lives:
            lv.turn, lv.env_s = 0, 0.0
            self.calls[self.pool.submit(self.loop._start, lv)] = (lv, None)
        self.live += len(lives)
        return [lv.ep for lv in lives]

    @property
    def busy(self) -> bool:
        """Episodes still running."""
        return self.live > 0

    def advance(self, max_wait_s: float = 0.05) -> list[Episode]:
        """One round: take the env calls that ended (waiting up to ``max_wait_s`` when no episode is ready), then
        one batched generate over the ready episodes; returns the episodes that finished in this round."""
        done: list[LiveEpisode] = []
        t0 = time.perf_counter()
        wait = 0.0 if self.ready else max_wait_s
        self._harvest(wait, done)
        if not self.ready and wait:
            self.stats["env_wait_s"] += time.perf_counter() - t0
        if self.ready:
            self._gather(done)
            self._generate(done)
        return [self._retire(lv) for lv in done]

    def run(self, tasks: Sequence[Mapping[str, Any]]) -> list[Episode]:
        """Every task's episode to its end; returns them in task order (one step's rollout)."""
        t_run = time.perf_counter()
        self.stats = self._new_stats()
        episodes = self.add(tasks)
        try:
            while self.busy:
                self.loop.check_abandon()  # a stop signal: give up between two rounds
                self.advance(max_wait_s=0.05)
        finally:
            self.close()
        self.stats["total_s"] = total = time.perf_counter() - t_run
        for ep in episodes:
            ep.trajectory.info["rollout_time_s"] = total
        return episodes

    def close(self) -> None:
        """Close every env (also of episodes still running) and stop the threads."""
        for lv, _ in list(self.calls.values()):
            if not lv.done:
                lv.finish("env_error", "the rollout was stopped while this env call ran")
        self.calls.clear()
        self.ready.clear()
        self._collect_closes(min(self.cfg.env_timeout_s, 10.0))
        self.pool.shutdown()

    # ------------------------------------------------------------------------------------------------ rounds
    def _harvest(self, wait_s: float, done: list[LiveEpisode]) -> None:
        loop, timeout = self.loop, self.cfg.env_timeout_s
        for fut, status, value in self.pool.harvest(list(self.calls), timeout, wait_s):
            lv, turn = self.calls.pop(fut)
            started = getattr(fut, "started_at", None)
            if started is not None:
                lv.env_s += time.monotonic() - started
            if turn is None:
                loop._take_reset(lv, status, value)
            else:
                loop._take_step(lv, turn, status, value, lv.turn)
                lv.turn += 1
                if not lv.done and lv.turn >= self.cfg.max_turns:
                    lv.finish("max_turns")
            (done if lv.done else self.ready).append(lv)

    def _gather(self, done: list[LiveEpisode]) -> None:
        """Wait (``gen_wait_ms`` at most) for more episodes to become ready, up to ``gen_batch_size``."""
        cap = self.cfg.gen_batch_size or float("inf")
        end = time.monotonic() + self.cfg.gen_wait_ms / 1000.0
        while len(self.ready) < cap and self.calls:
            left = end - time.monotonic()
            if left <= 0:
                break
            self._harvest(left, done)

    def _generate(self, done: list[LiveEpisode]) -> None:
        loop = self.loop
        cap = self.cfg.gen_batch_size or len(self.ready)
        batch = [self.ready.popleft() for _ in range(min(cap, len(self.ready)))]
        loop._prepare(batch)
        t0 = time.perf_counter()
        gens = loop.engine.generate([loop._prompt(lv) for lv in batch], loop._constrained(self.params, batch))
        self.stats["gen_s"] += time.perf_counter() - t0
        self.stats["generate_calls"] += 1
        self.stats["gen_rows"] += len(batch)
        if len(gens) != len(batch):
            raise RuntimeError(f"engine returned {len(gens)} generations for {len(batch)} prompts")
        for lv, gen in zip(batch, gens):
            turn = loop._take_reply(lv, gen)
            if turn is None:
                done.append(lv)
            else:
                self.calls[self.pool.submit(lv.env.step, turn.action.content)] = (lv, turn)

    def _retire(self, lv: LiveEpisode) -> Episode:
        self.live -= 1
        ep = lv.ep
        ep.trajectory.response_length = len(ep.response_ids)
        ep.trajectory.info["env_s"] = lv.env_s
        if lv.env is not None:
            self.closing.append((self.pool.submit(lv.env.close), lv))
        if len(self.closing) > 64:
            self._collect_closes(0.0)
        return ep

    def _collect_closes(self, timeout: float) -> None:
        if not self.closing:
            return
        if timeout <= 0:
            ended = [(f, lv) for f, lv in self.closing if f.done()]
            self.closing = [(f, lv) for f, lv in self.closing if not f.done()]
        else:
            ended, self.closing = self.closing, []
        results = self.pool.collect([f for f, _ in ended], max(timeout, 0.0) or 1.0) if ended else []
        for (_, lv), (status, value) in zip(ended, results):
            if status is not CallStatus.OK:
                lv.ep.trajectory.info["close_error"] = ("timed out" if status is CallStatus.TIMEOUT
                                                        else describe_error(value))
