"""Staleness: how old a sample's tokens are, and the admission rule that bounds it.

A policy version counts optimizer steps: the weights after v updates are version v. Every generated token records
the version that produced it (``Episode.versions``); a sample trained at version v has staleness
``v - min(versions of its generated tokens)``, so a partial rollout that spanned a weight update counts from its
oldest token.

Admission (the rule of AReaL's staleness manager): with B groups per training batch and η the allowed staleness,
a new group may start only while ``accepted + running + 1 <= (η + v + 1) * B``, where ``accepted`` counts every
group accepted so far (trained or waiting), ``running`` the groups in flight and v the current version. With η=0
this is one batch at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def group_staleness(versions: Iterable[Sequence[int]], version: int) -> int:
    """Staleness at ``version`` of a group whose episodes' tokens carry ``versions`` (-1: not generated)."""
    oldest = min((v for vs in versions for v in vs if v >= 0), default=version)
    return int(version) - int(oldest)


class Admission:
    """The admission rule and its counters (see the module doc); no model, env or clock inside, so it can be driven
    by a simulated one."""

    def __init__(self, batch_groups: int, max_staleness: int):
        if batch_groups < 1 or max_staleness < 0:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1 and max_staleness={max_staleness} >= 0")
        self.B = int(batch_groups)
        self.eta = int(max_staleness)
        self.version = 0
        self.accepted = 0  # every group accepted so far, trained or not
        self.running = 0
        self.consumed = 0

    def begin(self, version: int) -> None:
        """A stream starting (or resuming from a checkpoint) at ``version``: the ``version * B`` groups trained
        before it count as accepted, so the window holds ``(η + 1) * B`` groups again, not ``(η + v + 1) * B``."""
        self.version = int(version)
        self.accepted = self.consumed = self.version * self.B
        self.running = 0

    @property
    def capacity(self) -> int:
        return (self.eta + self.version + 1) * self.B

    def can_admit(self) -> bool:
        return self.accepted + self.running + 1 <= self.capacity

    def start(self) -> None:
        if not self.can_admit():
            raise RuntimeError(f"admission refused: accepted {self.accepted} + running {self.running} is at the "
                               f"capacity {self.capacity}")
        self.running += 1

    def finish(self, accepted: bool) -> None:
        """A running group completed; a rejected one (dynamic sampling) frees its place."""
        self.running -= 1
        self.accepted += int(accepted)

    def consume(self, n: int) -> None:
        self.consumed += int(n)
