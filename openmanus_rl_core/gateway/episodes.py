"""An agent's recorded calls as a training episode, never training on a token the policy did not produce.

**Segments.** Consecutive calls whose prompts each start with the previous call's prompt and completion, token for
token, form one segment, laid out as ONE multi-turn sample, as the agent loop lays its own (rollout/loop.py)::

    prompt   = call_0.prompt
    response = completion_0 | inserted_1 | completion_1 | inserted_2 | ... | completion_k
                 mask 1         mask 0       mask 1         mask 0              mask 1

``inserted_i`` is what the conversation added between two completions (the end of the assistant turn, the tool or
user messages, the next assistant header): tokens the policy did not produce, so masked. A call that does not
continue the previous one starts a new segment: one sample per segment, its prompt that call's prompt. An episode of
one segment is ``trajectory.info["gateway"] == "continuous"``, one of several ``"segments"``;
``info["gateway_segments"]`` counts them and ``info["gateway_bridged"]`` counts the bridged calls (below).

**Bridging** (:func:`prompt_for`, called by the gateway when it builds a call's prompt). Re-rendering a conversation
need not give back the tokens the policy produced: Qwen3's template drops the ``<think>`` blocks of earlier turns,
a template re-spaces a tool call's JSON, a framework sends a reply back without its reasoning. When the new request's
messages are the previous call's messages, then that call's reply (the same content and calls, reasoning aside), then
new messages, the prompt is the previous prompt and completion as recorded plus the new messages' tokens (the text
the chat template puts after that reply: found by rendering the conversation with a placeholder reply), so the
episode stays one sample. When the history really changed (trimmed, summarised, a reply edited, a handoff, other
tools), the prompt is the template's fresh rendering, and the episode gets a new segment there. Either way a call's
``prompt_ids`` are what the engine generated from.

Each call is a turn: its reply, the run's template's reading of it (``format`` and ``invalid_action`` score it like
any reply), and as its observation the last message of the next call (the env's answer, as the agent told it). The
reward the agent posted (or returned) is the last turn's env reward and ``info["score"]`` (``reward=agent`` scores
it); success is what it posted, else reward > 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openmanus_rl_core.gateway.records import Call, EpisodeRecord
from openmanus_rl_core.gateway.tools import ChatRenderer
from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn
from openmanus_rl_core.rollout.episode import Episode




# --------------------------------------------------------------------------------------------- bridging
@dataclass
class Prompt:
    """A call's prompt: ``ids`` to generate from; ``bridged``: continued from an earlier call's recorded tokens
    where the fresh rendering differs from them."""

    ids: list[int]
    bridged: bool = False


_PLACEHOLDER = "OMRLplaceholderReply"


def prompt_for(record: EpisodeRecord | None, messages: list[dict], tools: list | None, chat: ChatRenderer) -> Prompt:
    """The prompt of a request (see the module doc): the fresh rendering, or the continuation of the latest recorded
    call this conversation extends (its messages, its reply, then more) when the fresh rendering would not start with
    that call's tokens. ``record`` None (a static key): the fresh rendering. Needs each recorded call's request
    (``Call.messages``, ``Call.tools``)."""
    fresh = chat.ids(messages, tools)
    if record is None:
        return Prompt(fresh)
    history = [_message_key(m) for m in messages]
    for call in reversed(record.calls):
        k = len(call.messages)
        # the cheap tests first: a long episode's request is checked against many earlier calls
        if len(messages) <= k or (call.tools or None) != (tools or None) \
                or history[k - 1] != _message_key(call.messages[-1]) \
                or history[:k] != [_message_key(m) for m in call.messages] \
                or not _same_reply(messages[k], call, chat, tools):
            continue
        head = list(call.prompt_ids) + list(call.completion_ids)
        if fresh[:len(head)] == head:  # the template gives back the very tokens: nothing to bridge
            return Prompt(fresh)
        inserted = _inserted(chat, messages, k, tools, call.completion_ids)
        return Prompt(fresh) if inserted is None else Prompt(head + inserted, bridged=True)
    return Prompt(fresh)


def _message_key(m: dict) -> tuple:
    """What of a message the model sees, for telling whether a history changed (ids and reasoning fields aside:
    frameworks regenerate or drop them without changing the conversation)."""
    fns = [call.get("function") or {} for call in m.get("tool_calls") or ()]
    calls = tuple(fn.get("name") for fn in fns)
    args = tuple(_arguments(fn.get("arguments")) for fn in fns)
    return m.get("role"), (m.get("content") or "").strip(), calls, args


def _arguments(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return args
    return json.dumps(args, sort_keys=True)


def _same_reply(message: dict, call: Call, chat: ChatRenderer, tools: list | None) -> bool:
    """Whether ``message`` is ``call``'s reply as the gateway answered it: the same content and calls, whatever the
    reasoning (a framework may keep it in the content, in ``reasoning_content``, or drop it)."""
    if message.get("role") != "assistant":
        return False
    _, rest = chat.reasoning_parser.split(call.text)
    content, calls = chat.tool_parser.parse(rest, tools) if tools else (rest.strip(), [])
    _, theirs = chat.reasoning_parser.split(message.get("content") or "")
    mine = {"role": "assistant", "content": content, "tool_calls": calls}
    return _message_key(mine) == _message_key(dict(message, content=theirs))


def _inserted(chat: ChatRenderer, messages: list[dict], k: int, tools: list | None,
              completion_ids: list[int]) -> list[int] | None:
    """The tokens the chat template puts after the reply ``messages[k]``: the rest of its turn (less the end-of-turn
    token when the completion generated it), the later messages and the next assistant header. None when the
    template does not render a plain reply verbatim."""
    shown = list(messages)
    shown[k] = {"role": "assistant", "content": _PLACEHOLDER}
    text = chat.text(shown, tools, add_generation_prompt=True)
    closed = chat.text(shown[:k + 1], tools, add_generation_prompt=False)
    if text.count(_PLACEHOLDER) != 1 or closed.count(_PLACEHOLDER) != 1:
        return None
    ids = _encode(chat, text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER):])
    close = closed[closed.index(_PLACEHOLDER) + len(_PLACEHOLDER):].rstrip()
    end = _encode(chat, close) if close else []  # the turn's end marker, e.g. <|im_end|>
    if end and list(completion_ids[-len(end):]) == end and ids[:len(end)] == end:
        ids = ids[len(end):]
    return ids


def _encode(chat: ChatRenderer, text: str) -> list[int]:
    return list(chat.tokenizer.encode(text, add_special_tokens=False))


# --------------------------------------------------------------------------------------------- the episode
def segments(calls: list[Call]) -> list[list[int]]:
    """The calls' indices by segment: a call joins the segment of the call before it when its prompt starts with
    that call's prompt and completion, token for token."""
    out: list[list[int]] = []
    for i, call in enumerate(calls):
        if i and _continues(calls[i - 1], call):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _continues(before: Call, after: Call) -> bool:
    head = list(before.prompt_ids) + list(before.completion_ids)
    return len(after.prompt_ids) >= len(head) and list(after.prompt_ids[:len(head)]) == head


def continuous(calls: list[Call]) -> bool:
    """True when the calls are one segment."""
    return len(segments(calls)) <= 1


def episode_from_record(record: EpisodeRecord, template: Any = None, error: str | None = None) -> Episode:
    """The training episode of one agent run (see the module doc). ``error``: the agent failed (timed out,
    crashed): an ``env_error`` episode, which leaves the loss; so is an agent that made no call (its error says
    whether it posted a reward)."""
    task = record.task
    calls = record.calls
    if not calls and error is None:  # nothing the policy produced: nothing to train, whatever was posted
        error = ("the agent made no call to the gateway" if record.reward is None else
                 f"the agent posted a reward ({record.reward:g}) but made no call to the gateway")
    trajectory = Trajectory(task_id=task.get("task_id"), seed=task.get("seed"), group_id=task.get("group_id"),
                            initial_observation="", task=dict(task))
    parts = segments(calls)
    trajectory.info["gateway"] = "continuous" if len(parts) <= 1 else "segments"
    trajectory.info["gateway_segments"] = len(parts) if calls else 0
    trajectory.info["gateway_bridged"] = sum(call.bridged for call in calls)
    episode = Episode(trajectory=trajectory, prompt_ids=list(calls[0].prompt_ids) if calls else [])
    trajectory.initial_observation = calls[0].last_message if calls else ""
    starts = {part[0] for part in parts}
    for i, call in enumerate(calls):
        if i:
            trajectory.turns[-1].observation = call.last_message
            if i not in starts:
                before = calls[i - 1]
                _append(episode, call.prompt_ids[len(before.prompt_ids) + len(before.completion_ids):], mask=0)
        if len(parts) > 1 and i in starts:
            episode.contexts.append(list(call.prompt_ids))
            episode.context_turns.append(i)
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
