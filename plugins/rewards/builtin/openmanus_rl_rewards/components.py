"""Built-in reward components. Each is a :class:`~openmanus_rl_core.protocols.RewardComponent` class
built as ``cls(**kwargs)`` from a reward config's ``kwargs``; values below are unweighted (the composer
multiplies by the configured weight).

==================  ==================================================  ===================  ==============
name                value                                               range                compute_turns
==================  ==================================================  ===================  ==============
``goal``            1 if the episode succeeded else 0 (or the score)    [0, 1] (score: any)  no (last turn)
``length_penalty``  ``-scale * f(L / max_length)``                      <= 0                 no (last turn)
``format``          fraction of well-formed turns                       [0, 1]               yes
``invalid_action``  ``-(invalid turns) / (turns)``                      [-1, 0]              yes
``process``         sum / discounted sum / last of per-step env rewards any                  yes
``overlong``        DAPO's soft penalty for replies near the limit      [-1, 0]              yes
==================  ==================================================  ===================  ==============
"""

from __future__ import annotations

import math
import re
from typing import Any

from openmanus_rl_core.protocols import Trajectory, Turn

__all__ = ["GoalReward", "LengthPenalty", "FormatReward", "InvalidActionPenalty", "ProcessReward", "OverlongPenalty"]


def _choice(option: str, value: Any, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(f"unknown {option} {value!r}; valid {option}s are: {', '.join(valid)}")
    return value


# ----------------------------------------------------------------------------------------------- goal
class GoalReward:
    """Task success.

    ``use_score=False`` (default): 1.0 if the episode succeeded, else 0.0. Success is
    ``trajectory.success`` when set, else the last turn's ``info["success"]``, else failure.

    ``use_score=True``: the env's score instead: the last turn's ``info["score"]`` when present (envs
    that report a final/cumulative score, e.g. AgentGym, TextWorld), else the sum of the per-step env
    rewards (``trajectory.env_reward``). Zero turns -> 0.0.
    """

    def __init__(self, use_score: bool = False):
        self.use_score = bool(use_score)

    def compute(self, trajectory: Trajectory) -> float:
        last = trajectory.turns[-1].info if trajectory.turns else {}
        if self.use_score:
            if last.get("score") is not None:
                return float(last["score"])
            return trajectory.env_reward
        success = trajectory.success if trajectory.success is not None else last.get("success", False)
        return 1.0 if success else 0.0


# -------------------------------------------------------------------------------------- length_penalty
class LengthPenalty:
    """A penalty (<= 0) that grows with the response length ``L``; 0 at ``L == 0``.

    ``unit``: ``tokens`` (agent tokens: the sum of the turns' span lengths; observation tokens do not
    count), ``turns`` (number of turns) or ``chars`` (characters of the replies, for trajectories
    without token spans).

    With ``x = min(L, max_length) / max_length`` (or ``x = L`` when ``max_length`` is None)::

        linear:     -scale * x
        quadratic:  -scale * x**2
        log:        -scale * log(1 + x) / log(2)     (with max_length)   -scale * log(1 + L) (without)

    so with ``max_length`` every kind runs from 0 (empty) to ``-scale`` (at or beyond ``max_length``).
    Without ``max_length`` pick a small ``scale`` (e.g. 1e-3 per token).
    """

    KINDS = ("linear", "quadratic", "log")
    UNITS = ("tokens", "turns", "chars")

    def __init__(self, kind: str = "linear", unit: str = "tokens", max_length: float | None = None,
                 scale: float = 1.0):
        self.kind = _choice("kind", kind, self.KINDS)
        self.unit = _choice("unit", unit, self.UNITS)
        if max_length is not None and not (isinstance(max_length, (int, float)) and max_length > 0):
            raise ValueError(f"length_penalty max_length must be a positive number or None, got {max_length!r}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ValueError(f"length_penalty scale must be a finite number >= 0, got {scale!r}")
        self.max_length = max_length
        self.scale = float(scale)

    def length(self, trajectory: Trajectory) -> float:
        if self.unit == "turns":
            return float(trajectory.num_turns)
        if self.unit == "chars":
            return float(sum(len(t.response) for t in trajectory.turns))
        return float(sum(max(0, end - start) for start, end in trajectory.segments))

    def compute(self, trajectory: Trajectory) -> float:
        length = self.length(trajectory)
        x = min(length, self.max_length) / self.max_length if self.max_length else length
        if self.kind == "linear":
            f = x
        elif self.kind == "quadratic":
            f = x * x
        else:
            f = math.log1p(x) / math.log(2) if self.max_length else math.log1p(x)
        return -self.scale * f


# --------------------------------------------------------------------------------------------- format
class _TemplatesOwn:
    """The default of ``FormatReward(end_pattern=...)``: the run's template's own end pattern."""

    def __repr__(self) -> str:
        return "<the template's end_pattern>"


TEMPLATES_OWN = _TemplatesOwn()
DEFAULT_TEMPLATE_END = r"</action>\s*$"
"""The default ``react`` template's end pattern: what a FormatReward built alone (no template handed over) asks."""


class FormatReward:
    """Fraction of turns whose reply is well formed, in [0, 1] (0 with zero turns).

    A turn counts when the template parsed it as a valid action (``turn.action.valid``) AND, if ``require_end``
    (default True) and there is an end pattern, ``re.search(pattern, turn.response)`` matches. The pattern is
    ``end_pattern`` when given, else the run's template's own
    (:attr:`~openmanus_rl_core.protocols.ActionTemplate.end_pattern`, handed over by :meth:`use_template`): e.g.
    ``react``'s ``</action>\\s*$`` asks that the reply end right after the closing action tag, so text after the
    action (extra candidate actions, rambling) earns nothing and the reward cannot be gamed by spamming. A template
    that sets no end pattern, ``end_pattern: null`` or ``require_end: false`` counts every valid reply. Built alone
    (no template handed over), it asks the default template's ``</action>\\s*$``. The match is case-sensitive
    (``(?i)`` in the pattern relaxes it).

    ``compute_turns`` gives ``1/T`` to each counted turn, so the ``per_turn`` allocator credits the
    well-formed replies themselves.
    """

    def __init__(self, require_end: bool = True, end_pattern: str | None = TEMPLATES_OWN):
        self.require_end = bool(require_end)
        self.from_template = end_pattern is TEMPLATES_OWN
        self._set_end(DEFAULT_TEMPLATE_END if self.from_template else end_pattern, "format end_pattern")

    def use_template(self, template: Any) -> None:
        """Ask ``template``'s own ``end_pattern`` (None or absent: any valid reply counts), unless the config gave
        ``end_pattern``."""
        if self.from_template:
            self._set_end(getattr(template, "end_pattern", None),
                          f"the end_pattern of the template {type(template).__name__}")

    def _set_end(self, pattern: str | None, source: str) -> None:
        self.end_pattern = pattern
        try:
            self._end = re.compile(pattern) if (self.require_end and pattern is not None) else None
        except re.error as exc:
            raise ValueError(f"{source} {pattern!r} is not a valid regular expression: {exc}") from exc

    def well_formed(self, turn: Turn) -> bool:
        if not turn.action.valid:
            return False
        return self._end is None or self._end.search(turn.response) is not None

    def compute_turns(self, trajectory: Trajectory) -> list[float]:
        n = trajectory.num_turns
        return [1.0 / n if self.well_formed(t) else 0.0 for t in trajectory.turns]

    def compute(self, trajectory: Trajectory) -> float:
        n = trajectory.num_turns
        return sum(self.well_formed(t) for t in trajectory.turns) / n if n else 0.0


# ------------------------------------------------------------------------------------- invalid_action
class InvalidActionPenalty:
    """``-1`` per invalid turn: the template could not parse it (``turn.action.valid`` False) or the
    env rejected it (``turn.info["invalid"]`` true).

    ``normalize=True`` (default) divides by the number of turns, so the value lies in [-1, 0];
    ``normalize=False`` gives ``-(number of invalid turns)``. Zero turns -> 0.0.
    ``compute_turns`` puts each turn's share on that turn.
    """

    def __init__(self, normalize: bool = True):
        self.normalize = bool(normalize)

    @staticmethod
    def invalid(turn: Turn) -> bool:
        return (not turn.action.valid) or bool(turn.info.get("invalid"))

    def compute_turns(self, trajectory: Trajectory) -> list[float]:
        n = trajectory.num_turns
        per = 1.0 / n if (self.normalize and n) else 1.0
        return [-per if self.invalid(t) else 0.0 for t in trajectory.turns]

    def compute(self, trajectory: Trajectory) -> float:
        n = trajectory.num_turns
        bad = sum(self.invalid(t) for t in trajectory.turns)
        return -(bad / n if (self.normalize and n) else float(bad))


# -------------------------------------------------------------------------------------------- process
class ProcessReward:
    """A process reward over the env's per-step rewards ``r_0 .. r_{T-1}`` (``turn.reward``).

    ==============  ==============================  ==============================
    mode            value                           compute_turns (one per turn)
    ==============  ==============================  ==============================
    ``sum``         ``sum_i r_i``                   ``[r_0, ..., r_{T-1}]``
    ``discounted``  ``sum_i gamma**i * r_i``        ``[gamma**i * r_i]``
    ``last``        ``r_{T-1}``                     ``[0, ..., 0, r_{T-1}]``
    ==============  ==============================  ==============================

    ``discounted`` is the episode's discounted return seen from its start (later steps count less),
    ``gamma`` in (0, 1]. Zero turns -> 0.0. With the ``per_turn`` allocator each turn's value lands on
    that turn's last token.
    """

    MODES = ("sum", "discounted", "last")

    def __init__(self, mode: str = "sum", gamma: float = 0.99):
        self.mode = _choice("mode", mode, self.MODES)
        if not (isinstance(gamma, (int, float)) and 0 < gamma <= 1):
            raise ValueError(f"process gamma must be in (0, 1], got {gamma!r}")
        self.gamma = float(gamma)

    def compute_turns(self, trajectory: Trajectory) -> list[float]:
        rewards = [float(t.reward) for t in trajectory.turns]
        if self.mode == "sum":
            return rewards
        if self.mode == "discounted":
            return [self.gamma**i * r for i, r in enumerate(rewards)]
        return [0.0] * (len(rewards) - 1) + rewards[-1:]

    def compute(self, trajectory: Trajectory) -> float:
        return float(sum(self.compute_turns(trajectory)))


# -------------------------------------------------------------------------------------------- overlong
class OverlongPenalty:
    """DAPO's soft overlong punishment, per reply: with ``L`` a reply's tokens, ``L_max = max_length`` and a buffer
    ``B = buffer_frac * L_max``::

        0                          if L <= L_max - B
        (L_max - B - L) / B        if L_max - B < L <= L_max      (from 0 down to -1)
        -1                         if L > L_max

    The trajectory's value is the mean over its replies; ``compute_turns`` gives each reply its own penalty / T,
    so the ``per_turn`` allocator puts it on the reply that ran long. A reply cut at the limit is not a judgement
    on its content, so the penalty is soft: it tells the policy to finish earlier without the cliff of a hard -1.
    ``max_length`` is a reply's token limit (the shipped config takes ``rollout.max_new_tokens``).
    """

    def __init__(self, max_length: int, buffer_frac: float = 0.25):
        if not (isinstance(max_length, int) and max_length > 0):
            raise ValueError(f"overlong max_length must be a positive int, got {max_length!r}")
        if not (isinstance(buffer_frac, (int, float)) and 0 < buffer_frac <= 1):
            raise ValueError(f"overlong buffer_frac must be in (0, 1], got {buffer_frac!r}")
        self.max_length = max_length
        self.buffer = buffer_frac * max_length

    def penalty(self, length: int) -> float:
        if length > self.max_length:
            return -1.0
        return min(0.0, (self.max_length - self.buffer - length) / self.buffer)

    def compute_turns(self, trajectory: Trajectory) -> list[float]:
        n = len(trajectory.turns)
        return [self.penalty(max(0, t.span[1] - t.span[0])) / n for t in trajectory.turns]

    def compute(self, trajectory: Trajectory) -> float:
        return sum(self.compute_turns(trajectory))
