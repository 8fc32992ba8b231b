"""``reasoning_gym``: Reasoning Gym's procedural datasets (PyPI ``reasoning-gym``), one generated item per task,
scored by the dataset's own ``score_answer``.

Task id ``t`` is item ``t`` of ``reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config)`` (for a mix,
of Reasoning Gym's ``composite`` dataset of those datasets and weights): the very item Reasoning Gym gives for that
index, in every process. ``task_id=None`` picks a seeded random item; a given ``task_id`` ignores ``seed``.

An episode: :meth:`ReasoningGymEnv.reset` returns the item's question. Each :meth:`ReasoningGymEnv.step` takes an
answer (the template's action: the text inside ``<action>...</action>`` with ``react``; a reply the template cannot
parse arrives whole) and scores it with ``dataset.score_answer(answer, item)``:

- ``info["score"]``: that score, in [0, 1] (a scorer that raises scores 0, its error in ``info["score_error"]``);
- ``info["success"]``: ``score >= success_threshold`` (1.0);
- the step's reward: the score minus the previous attempt's, so the episode's rewards sum to its last answer's score.

The episode ends on success or after ``max_attempts`` answers (the env option sets it to ``env.max_turns``: one by
default). Before that, a wrong answer's observation is its score and a short hint, and the model answers again.
``reward=reasoning_gym`` trains on the score (the ``goal`` component reads the last ``info["score"]``); the default
reward's ``goal`` counts success only.

``oracle_action()`` is the item's answer (for the warm-up and tests); datasets without a reference answer
(``rush_hour``, ``graph_color``, ...) have no oracle: ``hasattr(env, "oracle_action")`` is False and the warm-up is
skipped.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

from openmanus_rl_core.protocols import StepResult, as_text

from openmanus_rl_env_reasoning_gym import datasets

__all__ = ["ReasoningGymEnv", "DEFAULT_INSTRUCTION"]

DEFAULT_INSTRUCTION = ("Solve the problem. Your action is the final answer only, without working or explanation; "
                       "when the question shows the form of the answer, follow it exactly.")


def _check_attempts(max_attempts: Any, success_threshold: Any) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts}: must be an integer >= 1")
    t = success_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t <= 1.0:
        raise ValueError(f"success_threshold={t}: must be a number in (0, 1]")


class ReasoningGymEnv:
    """A Reasoning Gym dataset as tasks (module docstring).

    kwargs: ``dataset`` (a name, or a mapping name -> weight for a mix), ``config`` (the dataset's own settings;
    for a mix, one mapping per name), ``size`` (task ids ``0..size-1``), ``seed`` (the dataset's seed),
    ``max_attempts`` (answers per episode), ``success_threshold`` (the score that counts as success),
    ``instruction`` (the task description templates put in the system prompt).
    """

    @dataclass
    class Kwargs:
        """``env.kwargs``, checked before the run starts: the dataset name, its settings against its own config
        class (names, and its validate()), the weights of a mix."""

        dataset: Union[str, Dict[str, float], None] = "leg_counting"
        config: Optional[Dict[str, Any]] = field(default_factory=dict)
        size: int = 10000
        seed: int = 0
        max_attempts: int = 1
        success_threshold: float = 1.0
        instruction: Optional[str] = None

        def __post_init__(self) -> None:
            _check_attempts(self.max_attempts, self.success_threshold)
            datasets.make_spec(self.dataset, self.config, self.size, self.seed)

    def __init__(self, dataset: Union[str, Dict[str, float], None] = "leg_counting",
                 config: Optional[Dict[str, Any]] = None, size: int = 10000, seed: int = 0, max_attempts: int = 1,
                 success_threshold: float = 1.0, instruction: Optional[str] = None):
        _check_attempts(max_attempts, success_threshold)
        self.spec = datasets.make_spec(dataset, config, size, seed)
        self.dataset = datasets.build(self.spec)
        self.num_tasks = self.spec.size
        self.max_attempts = int(max_attempts)
        self.success_threshold = float(success_threshold)
        self.instruction = DEFAULT_INSTRUCTION if instruction is None else str(instruction)
        self._has_oracle = datasets.has_answers(self.spec)
        self._index: int | None = None
        self._entry: dict[str, Any] | None = None
        self._attempts = 0
        self._last_score = 0.0
        self._done = True

    # ----------------------------------------------------------------------------------- protocol
    def _item_index(self, task_id: Any, seed: int | None) -> int:
        if task_id is None:
            return random.Random(seed).randrange(self.num_tasks)
        if isinstance(task_id, bool) or not isinstance(task_id, numbers.Integral):
            raise ValueError(f"reasoning_gym env: task_id must be an int, got {type(task_id).__name__} {task_id!r}")
        if not 0 <= int(task_id) < self.num_tasks:
            raise ValueError(f"reasoning_gym env: task_id {task_id} is out of range: {self.spec.label} has size "
                             f"{self.num_tasks} (task ids 0..{self.num_tasks - 1}); raise env.kwargs.size or check "
                             "env.train_tasks/env.val_tasks and the task files")
        return int(task_id)

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        """The question of item ``task_id`` (a seeded random item when None); its answer stays out of it."""
        self._index = self._item_index(task_id, seed)
        self._entry = copy.deepcopy(datasets.item(self.spec, self._index))  # a scorer may touch its entry
        self._attempts, self._last_score, self._done = 0, 0.0, False
        return str(self._entry["question"])

    def step(self, action: str) -> StepResult:
        """Score one answer with the dataset's ``score_answer`` (module docstring)."""
        if self._entry is None:
            raise RuntimeError("reasoning_gym env: call reset() before step()")
        info: dict[str, Any] = {"dataset": self.source, "item": self._index}
        if self._done:  # a step after the end: answered, never raised (the protocol's step is total)
            return StepResult("The episode is over.", 0.0, True, {**info, "invalid": True})
        answer = as_text(action)
        score, error = self.score(answer)
        self._attempts += 1
        reward, self._last_score = score - self._last_score, score
        success = score >= self.success_threshold
        self._done = success or self._attempts >= self.max_attempts
        info.update(score=score, success=success, attempt=self._attempts)
        if error is not None:
            info["score_error"] = error
        return StepResult(self._observation(answer, score, success, error), reward, self._done, info)

    def score(self, answer: str | None) -> tuple[float, str | None]:
        """``(dataset.score_answer(answer, item), None)`` for the current item; ``(0.0, "Error: ...")`` when the
        scorer raises or returns something that is not a finite number."""
        try:
            value = self.dataset.score_answer(answer, copy.deepcopy(self._entry))
            score = float(value)
        except Exception as exc:  # noqa: BLE001  (a dataset's scorer may raise on text it did not expect)
            return 0.0, f"{type(exc).__name__}: {str(exc)[:200]}"
        if not math.isfinite(score):
            return 0.0, f"score_answer returned {value!r}"
        return score, None

    def _observation(self, answer: str, score: float, success: bool, error: str | None) -> str:
        head = f"Score {score:.2f} of 1 (attempt {self._attempts} of {self.max_attempts})."
        if success:
            return f"{head} Correct."
        if self._done:
            return f"{head} No attempts left."
        if not answer.strip():
            why = "The answer was empty."
        elif error is not None:
            why = "The answer could not be read."
        elif score > 0:
            why = "The answer is partly right."
        else:
            why = "The answer is wrong."
        return (f"{head} {why} Check your work and answer again: the final answer only, in the form the question "
                "asks for.")

    def close(self) -> None:
        self._done = True

    # ----------------------------------------------------------------------------------- extras
    @property
    def source(self) -> str | None:
        """The current item's dataset (for a mix, the one it was drawn from)."""
        if self._entry is None:
            return None
        return (self._entry.get("metadata") or {}).get("source_dataset") or self.spec.names[0]

    @property
    def oracle_action(self):
        """The item's answer (``oracle_action()``), present only for datasets whose items carry one."""
        if not self._has_oracle:
            raise AttributeError(f"the Reasoning Gym dataset {self.spec.label} has no reference answers (its "
                                 "score_answer checks a solution), so the env has no oracle")
        return self._oracle_action

    def _oracle_action(self) -> str:
        if self._entry is None:
            raise RuntimeError("reasoning_gym env: call reset() before oracle_action()")
        answer = self._entry.get("answer")
        if not isinstance(answer, str):
            raise ValueError(f"item {self._index} of {self.spec.label} has no reference answer ({answer!r})")
        return answer

    def task_fields(self, task_id: int) -> dict[str, Any]:
        """Columns of this env's task files (``openmanus-rl data make`` writes them): the item's ``prompt``
        (question), ``ground_truth`` (answer, when it has one), ``data_source`` (its dataset) and ``metadata``
        (Reasoning Gym's, as JSON: with the question and answer it is the entry ``score_answer`` takes)."""
        entry = datasets.item(self.spec, self._item_index(task_id, None))
        meta = entry.get("metadata") or {}
        out: dict[str, Any] = {"prompt": str(entry["question"]),
                               "data_source": str(meta.get("source_dataset") or self.spec.names[0]),
                               "metadata": json.dumps(meta, default=str, sort_keys=True)}
        if isinstance(entry.get("answer"), str):
            out["ground_truth"] = entry["answer"]
        return out
