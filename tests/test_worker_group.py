"""A worker group under a local Ray: results in rank order, and a failing rank fails the call at once.

The failure case is the one that used to hang: rank 1 raises while rank 0 already waits for it in an all-reduce,
which gloo would only give up on after its (30-minute) collective timeout.
"""

from __future__ import annotations

import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from openmanus_rl_core.config.schema import Config, TrainerConfig  # noqa: E402
from openmanus_rl_core.distributed.worker_group import WorkerGroup, WorkerGroupError  # noqa: E402
from openmanus_rl_core.workers import Worker  # noqa: E402

CFG = Config(seed=0, trainer=TrainerConfig(torch_threads=1, device="cpu"))


class _SumWorker(Worker):
    """All-reduces its rank; rank ``fail_rank`` raises (or exits) before reaching the collective."""

    def setup(self, master_addr: str, master_port: int) -> dict:
        self.setup_distributed(master_addr, master_port)
        return {"rank": self.rank}

    def rank_sum(self, fail_rank: int = -1, how: str = "raise") -> float:
        import os

        import torch.distributed as dist

        if self.rank == fail_rank:
            if how == "exit":
                os._exit(3)
            raise ValueError(f"bad shard on rank {self.rank}")
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    def collector_view(self) -> tuple[int, int]:
        """Objects the set-up froze, and how many objects a full collection walks now."""
        import gc

        return gc.get_freeze_count(), len(gc.get_objects())

    def until_cancelled(self, limit_s: float = 20.0) -> str:
        """Waits, as an agent loop does between turns, until the driver cancels the call."""
        from openmanus_rl_core.process.stopping import cancelled_call

        cancelled, end = cancelled_call(), time.monotonic() + limit_s
        while not cancelled():
            if time.monotonic() > end:
                return "never cancelled"
            time.sleep(0.02)
        return "cancelled"

    def peer_raises_before_rank_1_dies(self) -> None:
        """The worst order of a crash: rank 0 raises at once (as its collective does when the peer's connection
        closes), and Ray learns of rank 1's death only later."""
        import os

        if self.rank == 1:
            time.sleep(0.5)
            os._exit(3)
        raise RuntimeError("Connection closed by peer")


@pytest.fixture(scope="module")
def ray_local():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import the test module
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _group() -> WorkerGroup:
    return WorkerGroup(_SumWorker, 2, CFG, num_cpus=1, name="summer", model_dir="", total_steps=1)


def test_call_returns_every_rank_result_in_rank_order(ray_local):
    group = _group()
    try:
        assert group.setup_info == [{"rank": 0}, {"rank": 1}]
        assert group.call("rank_sum") == [3.0, 3.0]  # 1 + 2 on both ranks
        # Set up, each rank froze its heap: a full collection no longer walks the imported modules, only what the
        # rank made since.
        for frozen, walked in group.call("collector_view"):
            assert frozen > 100_000 and walked < frozen / 10, (frozen, walked)
        assert group.call_each("rank_sum", [(-1,), (-1,)]) == [3.0, 3.0]
        with pytest.raises(ValueError, match=r"summer.rank_sum: got 1 argument sets for 2 ranks"):
            group.call_each("rank_sum", [(-1,)])
    finally:
        group.kill()


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failing_rank_fails_the_call_at_once_and_stops_the_group(ray_local, how):
    group = _group()
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerGroupError) as info:
            group.call("rank_sum", 1, how)  # rank 0 is left waiting in the all-reduce
        took = time.monotonic() - t0
        err = info.value
        assert (err.group, err.rank, err.method) == ("summer", 1, "rank_sum")
        assert str(err).startswith("summer rank 1 failed in rank_sum: ")
        if how == "raise":
            assert "bad shard on rank 1" in str(err)
        assert took < 60, f"the failure took {took:.1f}s to surface"
        assert group.workers == []  # stopped, including rank 0 that was blocked in the collective
        with pytest.raises(RuntimeError, match=r"summer worker group was stopped .* cannot call rank_sum"):
            group.call("rank_sum")
    finally:
        group.kill()
    # The group's resources are free again: a new group of two ranks fits and works.
    again = _group()
    try:
        assert again.call("rank_sum") == [3.0, 3.0]
    finally:
        again.kill()


def test_a_rank_that_died_is_named_rather_than_the_peer_that_raised_because_of_it(ray_local):
    group = _group()
    try:
        with pytest.raises(WorkerGroupError) as info:
            group.call("peer_raises_before_rank_1_dies")
        assert info.value.rank == 1 and isinstance(info.value.cause, ray.exceptions.RayActorError)
        assert str(info.value).startswith("summer rank 1 failed in peer_raises_before_rank_1_dies: ")
    finally:
        group.kill()


def test_an_abandoned_call_is_cancelled_on_every_rank_and_frees_them_for_the_next_call(ray_local):
    from openmanus_rl_core.process.stopping import Abandoned

    group = _group()
    try:
        t0 = time.monotonic()
        with pytest.raises(Abandoned, match=r"summer.until_cancelled abandoned: the run is stopping"):
            group.call_each("until_cancelled", [(), ()], abandon=lambda: time.monotonic() > t0 + 0.5)
        took = time.monotonic() - t0
        assert 0.5 <= took < 5.0, took  # not the 20 s the ranks would wait uncancelled
        assert group.call("rank_sum") == [3.0, 3.0]  # both ranks gave the call up and answer again
        with pytest.raises(Abandoned):  # already stopping: the call is not even started
            group.call_each("rank_sum", [(-1,), (-1,)], abandon=lambda: True)
        assert group.call_each("until_cancelled", [(0.2,), (0.2,)], abandon=lambda: False) == ["never cancelled"] * 2
    finally:
        group.kill()
