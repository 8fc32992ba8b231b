"""Conformance kit: checks a plugin author runs on an env, template, reward component, allocator or memory.

Each ``check_*`` raises :class:`ConformanceError` (an ``AssertionError``) saying what the component did
wrong, with the offending input. Call them from your plugin's tests::

    from openmanus_rl_core.testing import check_env, check_template

    def test_my_env_conforms():
        check_env(lambda: MyEnv(), task_ids=[0, 1])

The kit feeds hostile text (empty, huge, unicode, control characters, markup) drawn from a seeded
generator, so a failure reproduces.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Iterable, Sequence

from openmanus_rl_core.protocols import (
    ActionTemplate,
    Env,
    Memory,
    OracleEnv,
    ParsedAction,
    PastTurn,
    StepResult,
    Trajectory,
    Turn,
)

__all__ = [
    "ConformanceError",
    "hostile_texts",
    "check_env",
    "check_oracle",
    "oracle_rollout",
    "check_template",
    "check_reward",
    "check_allocator",
    "check_memory",
    "sample_trajectories",
    "SMALL_RUN",
]

SMALL_RUN = [
    "env=key_door", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
    "data.train_batch_size=4", "algorithm.n=4", "env.train_tasks=16", "env.val_tasks=4", "rollout.max_new_tokens=8",
    "warmup.steps=2", "warmup.batch_size=4", "warmup.validate=false", "trainer.val_before_train=false",
    "trainer.val_freq=0", "trainer.progress=false", "trainer.num_cpus=2", "trainer.total_steps=2",
]
"""Overrides of the smallest training run that exercises every phase (a one-layer 32-wide tiny model, 4 tasks x 4
samples, a 2-step warm-up, 2 RL steps, one validation at the end): for a plugin's end-to-end test."""


class ConformanceError(AssertionError):
    """A plugin broke the contract of :mod:`openmanus_rl_core.protocols`."""


def _fail(what: str, detail: str) -> None:
    raise ConformanceError(f"{what}: {detail}")


_FIXED_HOSTILE = [
    "",
    " ",
    "\n\n\n",
    "\x00\x01\x02\x1b[31m",
    "<action></action>",
    "<action>unterminated",
    "</action><action>",
    "Action:",
    "Thought: \nAction:\n",
    '{"name": "act", "arguments": {"action": null}}',
    "{" * 200,
    "ünïcödé ✓ 漢字 🙂",
    "a" * 20_000,
    "look\r\nlook",
    "'; DROP TABLE envs; --",
    "${jndi:ldap://x}",
    "{{7*7}}",
]


def hostile_texts(n: int = 40, seed: int = 0) -> list[str]:
    """A fixed list of nasty strings plus ``n`` random ones from a seeded generator."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz <>/{}[]\"':,.\n\t\\0123456789_-!?ÿ漢🙂\x00"
    out = list(_FIXED_HOSTILE)
    for _ in range(n):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))))
    return out


# ----------------------------------------------------------------------------------------------- env
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
    make_env: Callable[[], Env],
    task_ids: Sequence[int | None] = (0, 1),
    seed: int = 0,
    actions: Iterable[str] | None = None,
    max_steps: int = 8,
    hostile: int = 20,
) -> None:
    """Check an env: reset returns text and is deterministic, step takes any text, close is idempotent.

    ``actions`` are well-formed actions to try besides the hostile texts. ``max_steps`` bounds each episode.
    """
    env = make_env()
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
    make_env: Callable[[], OracleEnv],
    task_ids: Sequence[int],
    seed: int = 0,
    max_steps: int = 50,
) -> None:
    """Check that following ``oracle_action()`` succeeds (``info['success']``) on every task."""
    env = make_env()
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


# ------------------------------------------------------------------------------------------ template
def check_template(template: ActionTemplate, actions: Sequence[str] = ("look", "go north", "say apple")) -> None:
    """Check a template: a system prompt, stop strings, ``parse`` never raises, ``render`` round-trips."""
    if not isinstance(template, ActionTemplate):
        _fail(type(template).__name__, "does not implement ActionTemplate (stop, system_prompt, parse, render)")
    if not isinstance(template.stop, list) or not all(isinstance(s, str) and s for s in template.stop):
        _fail("template.stop", f"must be a list of non-empty strings, got {template.stop!r}")
    prompt = template.system_prompt("Do the task.")
    if not isinstance(prompt, str) or "Do the task." not in prompt:
        _fail("system_prompt('Do the task.')", f"must return text containing the instruction, got {prompt!r}")
    for text in hostile_texts():
        try:
            parsed = template.parse(text)
        except Exception as exc:  # the contract says never raise
            _fail(f"parse({text[:40]!r})", f"raised {type(exc).__name__}: {exc}")
        if not isinstance(parsed, ParsedAction) or not isinstance(parsed.content, str) or not isinstance(parsed.valid, bool):
            _fail(f"parse({text[:40]!r})", f"must return ParsedAction with str content and bool valid, got {parsed!r}")
    for action in actions:
        reply = template.render(action)
        parsed = template.parse(reply)
        if not parsed.valid or parsed.content != action:
            _fail(f"parse(render({action!r}))", f"expected a valid action {action!r}, got {parsed!r}")
        for stop in template.stop:
            # a reply cut at the first stop string (as engines do) must still parse the same.
            if stop in reply:
                cut = reply[: reply.index(stop) + len(stop)]
                if template.parse(cut).content != action:
                    _fail(f"render({action!r}) cut at stop {stop!r}", f"parses as {template.parse(cut)!r}")


# ------------------------------------------------------------------------------------------ rewards
def sample_trajectories() -> list[Trajectory]:
    """A few varied trajectories: empty, single-turn success, multi-turn failure, invalid turns, env error."""
    def turn(text: str, valid: bool, reward: float, done: bool, span: tuple[int, int], **info: Any) -> Turn:
        kind = "action" if valid else "invalid"
        return Turn(text, ParsedAction(kind, text, valid), "ok", reward, done, dict(info), span)

    return [
        Trajectory(task_id=0, seed=0, group_id=0, initial_observation="start", termination="env_error",
                   error="server died"),
        Trajectory(task_id=1, seed=0, group_id=1, initial_observation="say apple", success=True,
                   turns=[turn("<action>apple</action>", True, 1.0, True, (0, 5), success=True)], response_length=5,
                   task={"ground_truth": "apple"}),
        Trajectory(task_id=2, seed=1, group_id=2, initial_observation="a room", success=False, termination="max_turns",
                   turns=[turn("<action>look</action>", True, 0.0, False, (0, 4)),
                          turn("garbage", False, 0.0, False, (10, 13), invalid=True),
                          turn("<action>open box</action>", True, 0.5, False, (20, 26))],
                   response_length=30, task={"ground_truth": "42"}),
    ]


def check_reward(component: Any, trajectories: Sequence[Trajectory] | None = None) -> None:
    """Check a reward component: finite values on varied trajectories, ``compute_turns`` consistent."""
    if not callable(getattr(component, "compute", None)):
        _fail(type(component).__name__, "has no compute(trajectory)")
    for i, traj in enumerate(trajectories or sample_trajectories()):
        value = component.compute(traj)
        score = value.get("score") if isinstance(value, dict) else value
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            _fail(f"compute(trajectory {i})", f"must return a finite number (or a dict with 'score'), got {value!r}")
        turns_fn = getattr(component, "compute_turns", None)
        if callable(turns_fn):
            per_turn = list(turns_fn(traj))
            if len(per_turn) != len(traj.turns):
                _fail(f"compute_turns(trajectory {i})", f"returned {len(per_turn)} values for {len(traj.turns)} turns")
            if traj.turns and not math.isclose(sum(per_turn), float(score), rel_tol=1e-6, abs_tol=1e-9):
                _fail(f"compute_turns(trajectory {i})", f"sums to {sum(per_turn)} but compute() gave {score}")


# --------------------------------------------------------------------------------------- allocators
def check_allocator(allocator: Callable[..., Sequence[float]], rewards: Sequence[float] = (1.0, -0.5, 0.0)) -> None:
    """Check an allocator: right length, zero outside the agent segments, finite values."""
    cases = [
        ([(0, 4)], 4),
        ([(0, 3), (6, 9)], 12),
        ([(2, 5), (5, 5), (8, 10)], 10),
    ]
    for reward in rewards:
        for segments, length in cases:
            turn_rewards = [reward / len(segments)] * len(segments)
            where = f"allocator(reward={reward}, segments={segments}, length={length})"
            out = list(allocator(reward, turn_rewards, segments, length))
            if len(out) != length:
                _fail(where, f"returned {len(out)} values, expected {length}")
            inside = {i for s, e in segments for i in range(s, e)}
            for i, v in enumerate(out):
                if not math.isfinite(float(v)):
                    _fail(where, f"position {i} is {v}")
                if i not in inside and v != 0:
                    _fail(where, f"position {i} is outside every agent segment but got {v}")
            if reward != 0 and not any(out):
                _fail(where, "placed no reward at all")


# ------------------------------------------------------------------------------------------ memories
def check_memory(memory: Any, turns: int = 12) -> None:
    """Check a memory: ``per_turn`` is a bool; ``messages`` returns a chat (role/content str dicts) that opens with
    the system prompt, shows the task, ends with a user message holding the current observation, is the same for
    the same input and leaves the history untouched; hostile texts never make it raise."""
    if not isinstance(memory, Memory) or not isinstance(memory.per_turn, bool):
        _fail(type(memory).__name__, "does not implement Memory (a bool per_turn, messages(system, task, history))")
    hostile = hostile_texts(2 * turns, seed=1)
    history = [PastTurn(reply=f"reply {k} " + hostile[2 * k][:200], action=f"act {k}",
                        observation=f"observation {k} " + hostile[2 * k + 1][:200]) for k in range(turns)]
    before = [(t.reply, t.action, t.observation) for t in history]
    for k in range(turns + 1):
        where = f"messages(system, task, history of {k} turns)"
        try:
            out = memory.messages("SYSTEM PROMPT", "THE TASK", history[:k])
        except Exception as exc:  # the loop calls it every turn: it must not raise
            _fail(where, f"raised {type(exc).__name__}: {exc}")
        if not isinstance(out, list) or not out or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in out):
            _fail(where, f"must return a non-empty list of {{'role': system|user|assistant, 'content': str}}, "
                         f"got {out!r:.300}")
        if out[0] != {"role": "system", "content": "SYSTEM PROMPT"}:
            _fail(where, f"must open with the system prompt as given, got {out[0]!r:.200}")
        if not any("THE TASK" in m["content"] for m in out if m["role"] == "user"):
            _fail(where, "does not show the task (the first observation) in any user message")
        current = history[k - 1].observation if k else "THE TASK"
        if out[-1]["role"] != "user" or current not in out[-1]["content"]:
            _fail(where, f"must end with a user message holding the current observation {current[:60]!r}")
        if memory.messages("SYSTEM PROMPT", "THE TASK", history[:k]) != out:
            _fail(where, "is not deterministic: the same input gave another chat")
    if [(t.reply, t.action, t.observation) for t in history] != before:
        _fail("messages(...)", "changed the history it was given")
