"""One episode's trajectory and tokens, as the loop produces it and the batch assembly reads it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from openmanus_rl_core.protocols import PastTurn, Summary, Trajectory


@dataclass
class Episode:
    """One finished episode: its trajectory and its tokens.

    ``response_mask[i]`` is 1 on tokens the model generated, 0 on observation / chat-template tokens;
    ``logprobs`` is aligned with ``response_ids`` (the engine's log-prob on mask-1 tokens, 0 elsewhere).
    ``truncated``: a token limit cut something (the prompt, an observation, or the episode itself).
    ``anchor_obs[t]``: the observation turn ``t`` acted on. ``uid``: unique per episode.

    With a per-turn memory, ``contexts[t]`` is the prompt the model saw before reply ``t`` (its own training
    sample); ``response_ids`` then holds the replies back to back (all mask 1, ``Turn.span`` indexes them) and
    ``prompt_ids`` is ``contexts[0]``. With the ``full`` memory ``contexts`` is empty. ``context_turns`` (an agent
    behind the gateway whose history broke: one sample per segment of turns) makes ``contexts[k]`` the prompt of
    the sample that starts at turn ``context_turns[k]`` and runs to the next one's start; the response between
    holds its replies and the masked tokens between them.

    ``versions`` is aligned with ``response_ids``: the policy version (optimizer steps completed) whose weights
    generated each mask-1 token, -1 on mask-0 tokens. A partial rollout that spans a weight update holds several.

    ``choices``: for each token of a reply decoded under a constraint (``rollout.constrain_actions``), keyed by its
    position in ``response_ids``, the tokens the grammar allowed there: the policy at that position is the model's
    distribution over them. ``forced``: the positions where it allowed one token only, no decision of the policy;
    the actor's loss leaves them out (:func:`~openmanus_rl_core.rollout.assembly.build_batch`).
    """

    trajectory: Trajectory
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    anchor_obs: list[str] = field(default_factory=list)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    contexts: list[list[int]] = field(default_factory=list)
    context_turns: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    choices: dict[int, list[int]] = field(default_factory=dict)

    @property
    def group_id(self) -> Any:
        return self.trajectory.group_id

    @property
    def forced(self) -> list[int]:
        """The positions in ``response_ids`` where a constraint allowed one token only (module doc: ``choices``)."""
        return sorted(k for k, allowed in self.choices.items() if len(allowed) == 1)

    @property
    def step_ids(self) -> list[int]:
        """Per response token: the turn index on that turn's reply tokens, -1 elsewhere."""
        out = [-1] * len(self.response_ids)
        for t, (s, e) in enumerate(self.trajectory.segments):
            out[s:e] = [t] * (e - s)
        return out

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version among the generated tokens (None: no token generated)."""
        return min((v for v in self.versions if v >= 0), default=None)

    def context_ids(self, t: int) -> list[int]:
        """The exact tokens the model saw before reply ``t``."""
        if self.contexts and self.context_turns:
            k = max(k for k, first in enumerate(self.context_turns) if first <= t)
            start = self.trajectory.turns[self.context_turns[k]].span[0]
            return list(self.contexts[k]) + self.response_ids[start: self.trajectory.turns[t].span[0]]
        if self.contexts:
            return list(self.contexts[t])
        return self.prompt_ids + self.response_ids[: self.trajectory.turns[t].span[0]]

    def samples(self) -> list[tuple[list[int], tuple[int, int], tuple[int, int]]]:
        """The episode's training samples: ``(prompt ids, response slice [s, e), turns [first, last + 1))``: one
        for the whole episode, one per turn with a per-turn memory, one per segment with ``context_turns``."""
        spans = self.trajectory.segments
        if not self.contexts:
            return [(self.prompt_ids, (0, len(self.response_ids)), (0, len(spans)))]
        starts = self.context_turns or list(range(len(spans)))
        ends = list(starts[1:]) + [len(spans)]
        return [(self.contexts[k], (spans[a][0], spans[b - 1][1]), (a, b))
                for k, (a, b) in enumerate(zip(starts, ends))]


class LiveEpisode:
    """Book-keeping of one episode while it runs."""

    __slots__ = ("ep", "env", "obs", "done", "generation", "system", "task", "history", "summary", "pending",
                 "turn", "env_s", "tools", "constraint")

    def __init__(self, ep: Episode):
        self.ep = ep
        self.env: Any = None
        self.obs = ""  # the observation the next reply acts on
        self.done = False
        self.generation: Any = None
        # Per-turn memories: the system prompt, the first observation and the finished turns, as shown.
        self.system = ""
        self.task = ""
        self.history: list[PastTurn] = []
        self.summary = Summary()  # a model-written summary of the turns before the memory's window
        self.pending = False  # its next context waits for the summary (built right before generating)
        self.tools: list[dict] | None = None  # the tools its chat template shows (rollout/chat.py: prompt_tools)
        self.constraint: Any = None  # its next reply's Constraint (rollout/choices.py), None: a free reply

    def finish(self, termination: str, error: str | None = None) -> None:
        """The episode ends now, for ``termination`` (a :data:`TERMINATIONS` value)."""
        self.done = True
        self.ep.trajectory.termination = termination
        if error is not None:
            self.ep.trajectory.error = error
        self.ep.truncated = self.ep.truncated or termination == "truncated"
