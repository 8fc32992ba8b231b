"""Your own agent as an actor rank's rollout: the counterpart of the agent loop when ``agent.command`` or
``agent.function`` is set.

Each rank serves its rollout engine behind a :class:`~openmanus_rl_core.gateway.server.Gateway` (started once, on
127.0.0.1), runs the agent once per task row it is given (each row is one sample of a group: ``rollout.n`` rows per
task), and turns each run's recorded calls into an episode (:mod:`~openmanus_rl_core.gateway.episodes`). The
trainer takes those episodes as it takes the loop's: GRPO groups, every estimator, validation (greedy, as the
loop's). An agent that hangs past ``agent.timeout_s`` or crashes ends its episode as ``env_error``: it leaves the
loss, is counted in ``rollout/termination/env_error``, and the step goes on.

Each episode carries how its agent went in ``trajectory.info["agent"]`` (:func:`agent_outcome`); the trainer writes
those to the run folder (run/agents.py).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable, Sequence

from openmanus_rl_core.gateway.agents import AgentJob, AgentOutcome, job_runner, run_agents, run_job, stop_groups
from openmanus_rl_core.gateway.episodes import episode_from_record
from openmanus_rl_core.gateway.records import EpisodeRecord
from openmanus_rl_core.gateway.server import Gateway, model_positions
from openmanus_rl_core.gateway.tools import ChatRenderer
from openmanus_rl_core.process.stopping import Abandoned


class AgentRollout:
    """``sampling(rollout_cfg).run(tasks)`` -> episodes, in task order (see the module doc). ``abandon``: polled
    while agents run; True gives the rollout up (:class:`~openmanus_rl_core.process.stopping.Abandoned`)."""

    def __init__(self, engine: Any, tokenizer: Any, template: Any, agent_cfg: Any, version: Callable[[], int],
                 batch_wait_s: float, log: Callable[[str], None] = print, lock: Any = None):
        self.template, self.cfg, self.log = template, agent_cfg, log
        # ``lock``: the rank's engine lock, held around each generate (a weight push lands between two).
        self.gateway = Gateway(engine, tokenizer, agent_cfg.model_name, version=version, lock=lock,
                               batch_wait_s=batch_wait_s, chat=ChatRenderer.for_agent(tokenizer, agent_cfg, log),
                               constrained=agent_cfg.constrained,
                               max_context_tokens=agent_cfg.max_context_tokens or model_positions(engine))
        self.abandon: Callable[[], bool] = lambda: False
        self.params = None  # the sampling of the next run (sampling())

    def sampling(self, rollout_cfg: Any) -> "AgentRollout":
        """Sample as ``rollout_cfg`` (the ``rollout`` section, with a validation's overrides) says, whatever the
        agents ask."""
        from openmanus_rl_core.rollout import sampling_params

        self.params = sampling_params(rollout_cfg)
        return self

    def run(self, tasks: Sequence[dict]) -> list:
        jobs = [AgentJob(self.gateway.open_episode(task, self.params), dict(task)) for task in tasks]
        try:
            outcomes = run_agents(jobs, self.cfg, self.gateway.base_url, self.cfg.model_name, self.log,
                                  abandon=self.abandon, running=self.gateway.agent_running)
        finally:
            records = [self.gateway.close_episode(job.key) for job in jobs]
        if self.abandon():
            raise Abandoned("the agents' rollout was given up")
        return [agent_episode(record, outcome, self.template) for record, outcome in zip(records, outcomes)]

    def close(self) -> None:
        self.gateway.close()


class AgentStream:
    """The group stream's runner over agents (the interface of :class:`~openmanus_rl_core.rollout.episodes.
    EpisodeRunner`): :meth:`add` starts one agent per task row in a background event loop, :meth:`advance` returns
    the episodes whose agents ended, :meth:`close` stops every agent still running."""

    def __init__(self, agents: AgentRollout, rollout_cfg: Any):
        from openmanus_rl_core.rollout import sampling_params

        self.agents, self.params = agents, sampling_params(rollout_cfg)
        self.gateway = agents.gateway
        cfg = agents.cfg
        self.groups: set[int] = set()
        self.run_one = job_runner(cfg, self.gateway.base_url, cfg.model_name, self.groups, agents.log)
        self.ended: queue.SimpleQueue = queue.SimpleQueue()
        self.live = 0
        self.stats: dict[str, Any] = {"generate_calls": 0, "gen_s": 0.0, "env_wait_s": 0.0, "gen_rows": 0}
        self.loop = asyncio.new_event_loop()
        self.slots = asyncio.Semaphore(int(cfg.max_concurrent))
        self.thread = threading.Thread(target=self.loop.run_forever, name="omrl-agent-stream", daemon=True)
        self.thread.start()

    def add(self, tasks: Sequence[dict]) -> None:
        for task in tasks:
            job = AgentJob(self.gateway.open_episode(task, self.params), dict(task))
            agent = run_job(job, self.run_one, self.slots, self.agents.log, self.gateway.agent_running)
            future = asyncio.run_coroutine_threadsafe(agent, self.loop)
            future.add_done_callback(lambda fut, job=job: self.ended.put((job, fut)))
            self.live += 1

    @property
    def busy(self) -> bool:
        return self.live > 0

    def advance(self, max_wait_s: float = 0.05) -> list:
        out, t0 = [], time.perf_counter()
        try:
            ended = [self.ended.get(timeout=max_wait_s)]
        except queue.Empty:
            self.stats["env_wait_s"] += time.perf_counter() - t0
            return out
        while True:
            try:
                ended.append(self.ended.get_nowait())
            except queue.Empty:
                break
        for job, fut in ended:
            self.live -= 1
            out.append(agent_episode(self.gateway.close_episode(job.key), fut.result(), self.agents.template))
        return out

    def close(self) -> None:
        stop_groups(self.groups, self.agents.log)
        for task in asyncio.all_tasks(self.loop):
            self.loop.call_soon_threadsafe(task.cancel)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def agent_episode(record: EpisodeRecord, outcome: AgentOutcome, template: Any) -> Any:
    """The training episode of one agent run, with :func:`agent_outcome` in its ``trajectory.info["agent"]``."""
    if outcome.reward is not None:  # a function agent's return value is its posted reward
        record.reward = float(outcome.reward)
    episode = episode_from_record(record, template, error=outcome.error)
    episode.trajectory.info["agent"] = agent_outcome(record, outcome)
    return episode


def agent_outcome(record: EpisodeRecord, outcome: AgentOutcome) -> dict[str, Any]:
    """How one agent went, as the run folder keeps it (run/agents.py): ``exit`` (a command's status, None for a
    function or an agent that never started), ``error`` (None: it ended normally), ``seconds``, ``calls`` (to the
    gateway), ``reward`` (posted or returned; None: none), ``stderr`` and ``stdout`` (a command's tails)."""
    return {"exit": outcome.exit, "error": outcome.error, "seconds": round(float(outcome.seconds), 3),
            "calls": len(record.calls), "reward": record.reward, "stderr": outcome.stderr, "stdout": outcome.stdout}
