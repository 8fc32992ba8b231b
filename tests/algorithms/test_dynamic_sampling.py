"""Lockstep dynamic sampling (``algorithm.filter_groups``; openmanus_rl_core/algorithms/dynamic_sampling.py
``fill_batch``): a step trains exactly B groups of n when enough rows have spread, and never plays more than
``max_extra_groups`` rows beyond the B it started with."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmanus_rl_core.algorithms.dynamic_sampling import GroupFilter, fill_batch


class Rows:
    """Task rows numbered 0, 1, 2, ... in order (``next_rows(k)``: the next k, B when None) and their play: each row
    one group of ``n`` episodes, whose successes differ (spread) when the row is in ``spread``."""

    def __init__(self, B: int, n: int, spread):
        self.B, self.n, self.spread = B, n, spread
        self.drawn = 0
        self.played: list[int] = []
        self.calls: list[list[int]] = []  # the rows of each play

    def next_rows(self, k=None):
        k = self.B if k is None else k
        rows = [{"task_id": i} for i in range(self.drawn, self.drawn + k)]
        self.drawn += k
        return rows

    def play(self, rows, first):
        assert rows, "fill_batch played no row"  # a refill of 0 rows would loop forever
        assert first == len(self.played)  # the index of the first row, as the trainer numbers group ids
        self.calls.append([r["task_id"] for r in rows])
        self.played += self.calls[-1]
        return [SimpleNamespace(group_id=r["task_id"], trajectory=SimpleNamespace(
                    success=r["task_id"] in self.spread and i % 2 == 0, task=dict(r, source="s")))
                for r in rows for i in range(self.n)]


def _fill(B, n, spread, max_extra, dropped=None):
    rows = Rows(B, n, spread)
    metrics: dict = {}
    episodes = fill_batch(rows.play, rows.next_rows, n, GroupFilter(None, "success"), max_extra, metrics, dropped)
    return episodes, metrics, rows


@pytest.mark.parametrize("spread, max_extra, trained, extra, filtered", [
    # half the rows have spread: 2 of 4 kept, the rate says 4 more rows, the budget allows 3: 2 more kept
    ({0, 2, 4, 6, 8}, 3, [0, 2, 4, 6], 3, 3),
    # 3 of 4 kept: the rate says 2 more rows, both kept: 5 groups, the step trains the first 4
    ({1, 2, 3, 4, 5, 6}, 3, [1, 2, 3, 4], 2, 1),
    # 1 kept, and the 3 extra rows have none: the budget is used up, the step trains the one group it has
    ({1}, 3, [1], 3, 6),
    # none kept: the last rows played (zero advantage; the step stays counted)...
    (set(), 3, [4, 5, 6], 3, 7),
    # ...but never more than B groups of them: here the refill played 8 rows
    (set(), 8, [4, 5, 6, 7], 8, 12),
    # no refill at all
    ({0}, 0, [0], 0, 3),
])
def test_fill_batch_trains_b_groups_of_n_within_the_extra_rows(spread, max_extra, trained, extra, filtered):
    B, n = 4, 2
    episodes, metrics, rows = _fill(B, n, spread, max_extra)
    groups = list(dict.fromkeys(e.group_id for e in episodes))
    assert groups == trained
    assert len(episodes) == n * len(trained) and len(episodes) <= B * n
    assert metrics == {"rollout/groups_extra": float(extra), "rollout/groups_filtered": float(filtered)}
    assert rows.played == list(range(B + extra)) and rows.drawn == B + extra


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 6), n=st.integers(2, 4), max_extra=st.integers(0, 8),
       spread=st.sets(st.integers(0, 15), max_size=16))
def test_fill_batch_trains_exactly_b_times_n_whenever_the_budget_reaches_b_groups_with_spread(B, n, max_extra, spread):
    """Rows are played in order, at most B + max_extra of them: the step trains exactly B x n episodes, all of groups
    with spread, iff B of those rows have spread; otherwise every group with spread it played (or, with none, the
    last rows played)."""
    dropped: list[dict] = []
    episodes, metrics, rows = _fill(B, n, spread, max_extra, dropped)
    reachable = [r for r in range(B + max_extra) if r in spread]
    # every row played is trained or recorded as dropped, never both, never neither (rollout dumps: exactly once)
    trained_rows = list(dict.fromkeys(e.group_id for e in episodes))
    assert sorted(trained_rows + [d["task_id"] for d in dropped]) == rows.played
    assert all(d["samples"] == n and d["source"] == "s" for d in dropped)
    assert all((d["reason"] == "surplus") == (d["task_id"] in spread) for d in dropped)
    assert len(rows.played) <= B + max_extra
    assert metrics["rollout/groups_extra"] == len(rows.played) - B <= max_extra
    groups = list(dict.fromkeys(e.group_id for e in episodes))
    if len(reachable) >= B:
        assert len(episodes) == B * n and groups == reachable[:B]
    elif reachable:
        assert groups == reachable and len(rows.played) == B + max_extra
    else:
        assert groups == rows.calls[-1][:B] and len(rows.played) == B + max_extra
    assert metrics["rollout/groups_filtered"] == len([r for r in rows.played if r not in spread])
