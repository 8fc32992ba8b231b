"""An agent's recorded calls as a training episode, never training on a token the policy did not produce.

**Continuity.** When every call's prompt, as the chat template rendered it, starts with the previous call's prompt
and completion, token for token, the episode is ONE multi-turn sample, laid out as the agent loop lays its own
(rollout/loop.py)::

    prompt   = call_0.prompt
    response = completion_0 | inserted_1 | completion_1 | inserted_2 | ... | completion_k
                 mask 1         mask 0       mask 1         mask 0              mask 1

``inserted_i`` is what the conversation added between two completions (the end of the assistant turn, the tool or
user messages, the next assistant header): tokens the policy did not produce, so masked. Otherwise (the harness
rewrote its history, or the template renders a reply differently from the tokens sampled, e.g. a reasoning model's
thinking dropped from earlier turns) each call is its own sample, ``prompt_i | completion_i``, as ``memory=window``
makes them. ``trajectory.info["gateway"]`` says which (``continuous`` or ``per_call``); the rollout metrics count
each.

Each call is a turn: its reply, the run's template's reading of it (``format`` and ``invalid_action`` score it like
any reply), and as its observation the last message of the next call (the env's answer, as the agent told it). The reward the agent posted (or returned) is the
last turn's env reward and ``info["score"]`` (``reward=agent`` scores it); success is what it posted, else reward > 0.
"""

from __future__ import annotations

from typing import Any

from openmanus_rl_core.gateway.server import Call, EpisodeRecord
from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.rollout.episode import Episode


def continuous(calls: list[Call]) -> bool:
    """True when each call's prompt extends the previous call's prompt and completion, token for token."""
    for before, after in zip(calls, calls[1:]):
        head = before.prompt_ids + before.completion_ids
        if after.prompt_ids[:len(head)] != head or len(after.prompt_ids) < len(head):
            return False
    return True


def episode_from_record(record: EpisodeRecord, template: Any = None, error: str | None = None) -> Episode:
    """The training episode of one agent run (see the module doc). ``error``: the agent failed (timed out,
    crashed, made no call): an ``env_error`` episode, which leaves the loss."""
    task = record.task
    calls = record.calls
    if not calls and error is None:
        error = "the agent made no call to the gateway"
    trajectory = Trajectory(task_id=task.get("task_id"), seed=task.get("seed"), group_id=task.get("group_id"),
                            initial_observation="", task=dict(task))
    joined = continuous(calls)
    trajectory.info["gateway"] = "continuous" if joined else "per_call"
    episode = Episode(trajectory=trajectory, prompt_ids=list(calls[0].prompt_ids) if calls else [])
    trajectory.initial_observation = calls[0].last_message if calls else ""
    for i, call in enumerate(calls):
        if i:
            trajectory.turns[-1].observation = call.last_message
            if joined:
                _append(episode, call.prompt_ids[len(calls[i - 1].prompt_ids) + len(calls[i - 1].completion_ids):],
                        mask=0)
        if not joined:
            episode.contexts.append(list(call.prompt_ids))
        start = len(episode.response_ids)
        _append(episode, call.completion_ids, mask=1, logprobs=call.logprobs, version=call.version)
        action = template.parse(call.text) if template is not None else ParsedAction("message", call.text, True)
        trajectory.turns.append(Turn(response=call.text, action=action, observation="", reward=0.0, done=False,
                                     span=(start, len(episode.response_ids))))
        episode.anchor_obs.append(call.last_message)
    if trajectory.turns:
        last = trajectory.turns[-1]
        last.done = True
        if record.reward is not None:
            last.reward = float(record.reward)
            last.info["score"] = float(record.reward)
    trajectory.response_length = len(episode.response_ids)
    if error is not None:
        trajectory.termination, trajectory.error = "env_error", error
    else:
        trajectory.success = record.success if record.success is not None else (
            None if record.reward is None else record.reward > 0)
    return episode


def _append(episode: Episode, ids: list[int], mask: int, logprobs: list[float] | None = None,
            version: int = -1) -> None:
    episode.response_ids.extend(ids)
    episode.response_mask.extend([mask] * len(ids))
    episode.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
    episode.versions.extend([version if mask else -1] * len(ids))
