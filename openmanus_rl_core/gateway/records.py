"""What the gateway records of an episode: each call as the policy produced it (:class:`Call`) and the episode
under its key (:class:`EpisodeRecord`); gateway/episodes.py turns a record into a training episode."""

from __future__ import annotations

from dataclasses import dataclass, field

from openmanus_rl_core.protocols import SamplingParams


@dataclass
class Call:
    """One chat completion as the policy produced it: the rendered prompt's ids, the completion's ids and their
    log-probs (aligned), the policy version of the weights that sampled them, and the reply's text."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int
    text: str
    finish_reason: str
    last_message: str = ""  # the text of the conversation's last message: what this reply answers
    # The request it answers, in the chat template's terms (whatever route it came by): what a later call of the
    # episode is compared with to continue from this one's tokens (gateway/episodes.py).
    messages: list[dict] = field(default_factory=list)
    tools: list | None = None
    bridged: bool = False  # its prompt continued an earlier call's recorded tokens


@dataclass
class EpisodeRecord:
    """What the gateway recorded under one key: the task, every call in order, the posted reward and success
    (None: not posted)."""

    key: str
    task: dict
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    success: bool | None = None
    sampling: SamplingParams | None = None  # how its calls are sampled (None: as the gateway's default says)
    # The Responses API's conversations, by response id: what ``previous_response_id`` continues (responses.py).
    responses: dict[str, list[dict]] = field(default_factory=dict)
