"""Your own agent as an actor rank's rollout: the counterpart of the agent loop when ``agent.command`` or
``agent.function`` is set.

Each rank serves its rollout engine behind a :class:`~openmanus_rl_core.gateway.server.Gateway` (started once, on
127.0.0.1), runs the agent once per task row it is given (each row is one sample of a group: ``rollout.n`` rows per
task), and turns each run's recorded calls into an episode (:mod:`~openmanus_rl_core.gateway.episodes`). The
trainer takes those episodes as it takes the loop's: GRPO groups, every estimator, validation (greedy, as the
loop's). An agent that hangs past ``agent.timeout_s`` or crashes ends its episode as ``env_error``: it leaves the
loss, is counted in ``rollout/termination/env_error``, and the step goes on.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from openmanus_rl_core.gateway.agents import AgentJob, run_agents
from openmanus_rl_core.gateway.episodes import episode_from_record
from openmanus_rl_core.gateway.server import Gateway
from openmanus_rl_core.stopping import Abandoned


class AgentRollout:
    """``sampling(rollout_cfg).run(tasks)`` -> episodes, in task order (see the module doc). ``abandon``: polled
    while agents run; True gives the rollout up (:class:`~openmanus_rl_core.stopping.Abandoned`)."""

    def __init__(self, engine: Any, tokenizer: Any, template: Any, agent_cfg: Any, version: Callable[[], int],
                 log: Callable[[str], None] = print):
        self.template, self.cfg, self.log = template, agent_cfg, log
        # No engine lock here: the worker holds its own around the whole rollout.
        self.gateway = Gateway(engine, tokenizer, agent_cfg.model_name, version=version)
        self.abandon: Callable[[], bool] = lambda: False

    def sampling(self, rollout_cfg: Any) -> "AgentRollout":
        """Sample as ``rollout_cfg`` (the ``rollout`` section, with a validation's overrides) says, whatever the
        agents ask."""
        from openmanus_rl_core.rollout import sampling_params

        self.gateway.sampling = sampling_params(rollout_cfg)
        return self

    def run(self, tasks: Sequence[dict]) -> list:
        jobs = [AgentJob(self.gateway.open_episode(task), dict(task)) for task in tasks]
        try:
            outcomes = run_agents(jobs, self.cfg, self.gateway.base_url, self.cfg.model_name, self.log,
                                  abandon=self.abandon)
        finally:
            records = [self.gateway.close_episode(job.key) for job in jobs]
        if self.abandon():
            raise Abandoned("the agents' rollout was given up")
        episodes = []
        for record, outcome in zip(records, outcomes):
            if outcome.reward is not None:  # a function agent's return value is its posted reward
                record.reward = float(outcome.reward)
            episodes.append(episode_from_record(record, self.template, error=outcome.error))
        return episodes

    def close(self) -> None:
        self.gateway.close()
