"""``sciworld``: ScienceWorld (the ``scienceworld`` PyPI package, a Scala simulator on Java 17) in-process.

Text as AgentGym serves it: the first observation is the task description, a newline, then the answer to
``look around``; every step answers with the simulator's own text; actions are the simulator's (``open door to
kitchen``, ``pick up thermometer``, ``focus on water``, ...).

Score and success are ScienceWorld's: the score is 0-100 (``info["score"]``; it may go negative on a failed task,
which ends the episode), success is a score of 100. A step's reward is the score's change divided by 100, so an
episode's rewards sum to its final score / 100. The episode ends when the task is completed or failed, or after
``step_limit`` moves.

Task ids cover ScienceWorld's own splits (see :mod:`openmanus_rl_env_sciworld.tasks`): ``[0, num_train)`` its train
variations, then its dev variations (``num_dev``), then its test variations. ``seed`` is not used: a variation is
one fixed world. The oracle follows ``get_gold_action_sequence()`` (generated when the task loads).

Envs share JVMs (:mod:`openmanus_rl_env_sciworld.jvm`): ``envs_per_jvm`` simulators per java process with heap
``jvm_heap``; ``close()`` gives the simulator back and the last env of a JVM shuts it down.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from py4j.protocol import Py4JJavaError

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_sciworld.jvm import POOL
from openmanus_rl_env_sciworld.tasks import layout, select
from openmanus_rl_core.protocols import as_text

INSTRUCTION = (
    "You are an agent for science world. Every round I will give you an observation, you have to respond an action "
    "based on the observation to finish the given task. Actions: open/close OBJ, activate/deactivate OBJ, connect OBJ "
    "to OBJ, disconnect OBJ, use OBJ [on OBJ], look around, look at OBJ, look in OBJ, read OBJ, move OBJ to OBJ, pick "
    "up OBJ, put down OBJ, pour OBJ into OBJ, dunk OBJ into OBJ, mix OBJ, go to LOC, eat OBJ, flush OBJ, focus on OBJ, "
    "wait, wait1, examine OBJ, task, inventory."
)
UNKNOWN = "No known action matches that input."
MAX_ACTION_CHARS = 256


def _text(action: Any) -> str:
    # the simulator's parser reads printable words only; control characters never name anything
    return " ".join("".join(c if c.isprintable() else " " for c in as_text(action)).split())


class SciWorldEnv:
    """ScienceWorld through AgentGym's text; see the module docstring.

    kwargs: ``tasks`` (task names or ids such as ``"1-1"``; null: all 30), ``simplifications`` (ScienceWorld's
    simplification string, e.g. ``"easy"``), ``step_limit`` (moves per episode), ``envs_per_jvm``, ``jvm_heap``.
    """

    instruction = INSTRUCTION

    def __init__(self, tasks: Sequence[str] | None = None, simplifications: str = "", step_limit: int = 100,
                 envs_per_jvm: int = 32, jvm_heap: str = "1g"):
        self.rows, counts = layout(select(tasks))
        self.num_train, self.num_dev, self.num_test = counts["train"], counts["dev"], counts["test"]
        self.num_tasks = len(self.rows)
        self.simplifications = str(simplifications)
        self.step_limit = int(step_limit)
        self.envs_per_jvm = int(envs_per_jvm)
        self.jvm_heap = str(jvm_heap)
        if self.step_limit < 1:
            raise ValueError(f"step_limit={step_limit!r} must be >= 1")
        self._jvm = None
        self._server = None
        self.task: tuple[str, int, str] | None = None
        self.gold: list[str] = []
        self.score = 0
        self.done = True
        self.success = False

    def task_fields(self, task_id: int) -> dict:
        name, variation, split = self.rows[int(task_id) % self.num_tasks]
        return {"data_source": "sciworld", "extra": {"task": name, "variation": variation, "split": split}}

    # -------------------------------------------------------------------------------------------- env
    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        if task_id is None:
            task_id = random.Random(0 if seed is None else seed).randrange(self.num_tasks)
        try:
            self.task = self.rows[int(task_id) % self.num_tasks]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task_id={task_id!r} is not an int: pass an int in [0, {self.num_tasks}) or None") from exc
        if self._server is None:
            self._jvm, self._server = POOL.acquire(self.envs_per_jvm, self.jvm_heap)
        name, variation, _ = self.task
        self._server.load(name, int(variation), self.simplifications, True)
        self.gold = list(self._server.getGoldActionSequence())
        self.score = 0
        self.done = False
        self.success = False
        description = self._server.getTaskDescription()
        look = self._server.step("look around")
        self.moves_at_start = int(self._server.getNumMoves())
        self.taken = 0
        return f"{description}\n{look}"

    def step(self, action: Any) -> StepResult:
        if self._server is None or self.task is None:
            return StepResult("No episode: call reset() first.", 0.0, True, {"invalid": True, "success": False})
        if self.done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True, "success": self.success})
        text = _text(action)
        if not text or len(text) > MAX_ACTION_CHARS:
            return StepResult(UNKNOWN, 0.0, False, {"invalid": True, "score": self.score})
        try:
            observation = str(self._server.step(text))
        except Py4JJavaError:  # the simulator threw on this input; the world is unchanged
            return StepResult(UNKNOWN, 0.0, False, {"invalid": True, "score": self.score})
        if text == self.oracle_action():
            self.taken += 1  # the gold sequence advances only when its own next action was taken
        score = int(round(100 * self._server.getScore()))
        reward = (score - self.score) / 100.0
        self.score = score
        moves = int(self._server.getNumMoves()) - self.moves_at_start
        ended = bool(self._server.getCompleted()) or score < 0 or score >= 100
        info: dict[str, Any] = {"invalid": observation.strip() == UNKNOWN, "score": score, "moves": moves}
        if ended or moves >= self.step_limit:
            self.done = True
            self.success = score >= 100
            info["success"] = self.success
        return StepResult(observation, reward, self.done, info)

    def oracle_action(self) -> str:
        """The next action of the gold sequence not taken yet (its first entry is the reset's ``look around``)."""
        rest = self.gold[1:] if self.gold and self.gold[0] == "look around" else self.gold
        return rest[self.taken] if self.taken < len(rest) else "look around"

    def close(self) -> None:
        self.done = True
        if self._server is not None:
            jvm, server = self._jvm, self._server
            self._jvm = self._server = None
            POOL.release(jvm, server)

    def __del__(self) -> None:  # an env dropped without close() still gives its JVM slot back
        try:
            self.close()
        except Exception:
            pass
