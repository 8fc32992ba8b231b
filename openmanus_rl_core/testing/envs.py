"""Checks of an env (:class:`~openmanus_rl_core.protocols.Env`) and of its oracle, and a rollout the oracle
drives."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

from openmanus_rl_core.protocols import ActionTemplate, Env, OracleEnv, StepResult, Trajectory

from .common import _fail, _built, hostile_texts


def _env(make_env: Any, check: str) -> Any:
    """The env to check: ``make_env`` is a class (built with no arguments), an env, or a factory called once."""
    if isinstance(make_env, (type, Env)) or not callable(make_env):
        return _built(make_env, check)
    return make_env()


def _check_step_result(result: Any, where: str) -> StepResult:
    if not isinstance(result, StepResult):
        _fail(where, f"step() must return StepResult, got {type(result).__name__}")
    if not isinstance(result.observation, str):
        _fail(where, f"observation must be str, got {type(result.observation).__name__}")
    if not isinstance(result.reward, (int, float)) or isinstance(result.reward, bool) or not math.isfinite(result.reward):
        _fail(where, f"reward must be a finite number, got {result.reward!r}")
    if not isinstance(result.done, bool):
        _fail(where, f"done must be bool, got {result.done!r}")
    if not isinstance(result.info, dict):
        _fail(where, f"info must be a dict, got {type(result.info).__name__}")
    if "success" in result.info and not isinstance(result.info["success"], bool):
        _fail(where, f"info['success'] must be bool, got {result.info['success']!r}")
    return result


def check_env(
    make_env: type[Any] | Env | Callable[[], Env],
    task_ids: Sequence[int | None] = (0, 1),
    seed: int = 0,
    actions: Iterable[str] | None = None,
    max_steps: int = 8,
    hostile: int = 20,
) -> None:
    """Check an env: reset returns text and is deterministic, step takes any text, close is idempotent.

    ``make_env``: the env, its class (built with no arguments) or a factory. ``actions`` are well-formed actions
    to try besides the hostile texts. ``max_steps`` bounds each episode.
    """
    env = _env(make_env, "check_env")
    try:
        if not isinstance(env, Env):
            _fail(type(env).__name__, "does not implement the Env protocol (reset, step, close)")
        for task_id in task_ids:
            first = env.reset(task_id=task_id, seed=seed)
            if not isinstance(first, str):
                _fail(f"reset(task_id={task_id})", f"must return str, got {type(first).__name__}")
            again = env.reset(task_id=task_id, seed=seed)
            if again != first:
                _fail(f"reset(task_id={task_id}, seed={seed})", f"not deterministic: {first[:80]!r} vs {again[:80]!r}")
        texts = list(actions or []) + hostile_texts(hostile, seed)
        env.reset(task_id=task_ids[0] if task_ids else None, seed=seed)
        steps = 0
        for text in texts:
            where = f"step({text[:40]!r}{'...' if len(text) > 40 else ''})"
            result = _check_step_result(env.step(text), where)
            steps += 1
            if result.done or steps >= max_steps:
                env.reset(task_id=task_ids[0] if task_ids else None, seed=seed)
                steps = 0
    finally:
        env.close()
    env.close()  # closing twice must be harmless


def check_oracle(
    make_env: type[Any] | OracleEnv | Callable[[], OracleEnv],
    task_ids: Sequence[int],
    seed: int = 0,
    max_steps: int = 50,
) -> None:
    """Check that following ``oracle_action()`` succeeds (``info['success']``) on every task. ``make_env``: the env,
    its class (built with no arguments) or a factory."""
    env = _env(make_env, "check_oracle")
    try:
        if not hasattr(env, "oracle_action"):
            _fail(type(env).__name__, "has no oracle_action()")
        for task_id in task_ids:
            env.reset(task_id=task_id, seed=seed)
            result = None
            for _ in range(max_steps):
                result = _check_step_result(env.step(env.oracle_action()), f"oracle on task {task_id}")
                if result.done:
                    break
            if result is None or not result.done or not result.info.get("success", False):
                _fail(f"oracle on task {task_id}", f"did not succeed within {max_steps} steps: last {result!r}")
    finally:
        env.close()


class _OracleEngine:
    """A rollout engine whose reply is the template's rendering of the live env's ``oracle_action()`` (one episode
    at a time, so the live env is the one ``oracle_rollout`` built last)."""

    def __init__(self, tokenizer: Any, template: ActionTemplate, envs: list):
        self.tokenizer, self.template, self.envs = tokenizer, template, envs

    def generate(self, prompts: Sequence[Sequence[int]], params: Any) -> list:
        from openmanus_rl_core.protocols import Generation

        out = []
        for _ in prompts:
            text = self.template.render(self.envs[-1].oracle_action())
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(list(ids), [0.0] * len(ids), text, "stop"))
        return out

    def update_weights(self, state_dict: dict) -> None:
        pass


def oracle_rollout(make_env: Callable[[], OracleEnv], tasks: Sequence[dict], template: ActionTemplate,
                   tokenizer: Any, **rollout: Any) -> list[Trajectory]:
    """Play each task (``{"task_id", "seed"}``) through the rollout loop (``rollout.AgentLoop``: chat token
    layout, template parsing, token limits, terminations), with the env's oracle writing the replies.

    ``rollout`` sets ``RolloutConfig`` fields (``max_turns``, ``max_response_tokens``, ...). Returns one
    trajectory per task; an env whose oracle is right gets ``success`` on every one.
    """
    from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, expand_tasks

    envs: list = []

    def factory() -> OracleEnv:
        envs.append(make_env())
        return envs[-1]

    loop = AgentLoop(_OracleEngine(tokenizer, template, envs), tokenizer, template, factory,
                     RolloutConfig(**{"max_new_tokens": 256, **rollout}))
    return [loop.run(expand_tasks([dict(task)], 1))[0].trajectory for task in tasks]
