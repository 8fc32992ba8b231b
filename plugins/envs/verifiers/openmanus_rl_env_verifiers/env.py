"""``env=verifiers``: an environment written with verifiers (0.4, v1 API), trained through the gateway.

The env option sets ``agent.function`` to :func:`openmanus_rl_env_verifiers.agent.play`, so the trainer never steps
this env: each episode is one verifiers episode of the task row (the taskset's own prompt, turns and rubric) played
by the policy at the gateway, and its reward is the rubric's. This class is what the trainer reads before the run:

- ``num_tasks``: the taskset's rows (``task_id`` indexes them, in ``load()`` order);
- ``reset(task_id, seed)``: the row's prompt text (the tiny model's tokenizer is trained on it);
- ``task_fields(task_id)``: the columns the agent reads from each task row (``verifiers_id``,
  ``verifiers_settings``), written into the run's task files;
- ``step``: ends the episode at once (an env driven by the agent loop would have nothing to do).

``env.kwargs``: ``id`` (a module name or ``owner/name@version``, resolved as verifiers resolves it), ``taskset``
(the taskset's own settings: its config's fields), ``max_tasks`` (load at most this many rows; required for a
taskset that never ends). A bad id is one line before anything is built (:class:`VerifiersEnv.Kwargs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_verifiers import spec

__all__ = ["VerifiersEnv"]


class VerifiersEnv:
    """The rows of a verifiers taskset, for task files and the tokenizer corpus (module docstring)."""

    instruction = ""  # each task's prompt says what to do

    @dataclass
    class Kwargs:
        """``env.kwargs``, checked before the run starts (the id must name a verifiers environment)."""

        id: Optional[str] = None
        taskset: Optional[dict] = None
        max_tasks: Optional[int] = None

        def __post_init__(self) -> None:
            spec.check(self.id, self.taskset, self.max_tasks)

    def __init__(self, id: Optional[str] = None, taskset: Optional[dict] = None,  # noqa: A002 (verifiers' word)
                 max_tasks: Optional[int] = None):
        spec.check(id, taskset, max_tasks)
        self.id = str(id)
        self.settings = spec.settings_key(taskset, max_tasks)
        self.rows = spec.rows(self.id, self.settings)
        self.num_tasks = len(self.rows)
        self._done = True

    def _row(self, task_id: Any) -> Any:
        return self.rows[int(task_id or 0) % self.num_tasks]

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        self._done = False
        data = self._row(task_id).data
        text = data.prompt_text
        return f"{data.system_prompt}\n\n{text}" if data.system_prompt else text

    def step(self, action: str) -> StepResult:
        self._done = True
        return StepResult("This environment is played by its verifiers episode (agent.function).", 0.0, True,
                          {"invalid": True})

    def task_fields(self, task_id: int) -> dict[str, Any]:
        """What the agent needs to rebuild this env in an actor worker, and the row's verifiers id."""
        data = self._row(task_id).data
        out: dict[str, Any] = {"verifiers_id": self.id, "verifiers_settings": self.settings}
        if data.id is not None:
            out["verifiers_task"] = str(data.id)
        return out

    def close(self) -> None:
        pass
