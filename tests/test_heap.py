"""The heap freeze at the end of set-up (``process/heap.py``): it collects first, so garbage made before it is freed,
not hidden from the collector for the whole run; ``unfreeze`` gives the hidden objects back."""

from __future__ import annotations

import gc
import weakref

from openmanus_rl_core.process import heap


class _Node:
    pass


def test_a_cycle_dropped_just_before_the_freeze_is_freed_not_frozen():
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection may free the cycle first: only the freeze's own collection can
    try:
        node = _Node()
        node.me = node  # a reference cycle: only the cyclic collector frees it
        alive = weakref.ref(node)
        del node
        assert alive() is not None  # unreachable, not yet freed
        frozen = heap.freeze()
        assert alive() is None
        # Another thread of the test process (Ray's, a pool's) may free a frozen object by reference count right
        # after the freeze, so the count can only fall from what freeze() returned.
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        heap.unfreeze()
        if was_enabled:
            gc.enable()
    assert gc.get_freeze_count() == 0
