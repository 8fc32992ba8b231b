"""A group of Ray actors forming one process group; a failing rank stops the group at once."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from openmanus_rl_core.config.schema import Config


class WorkerGroupError(RuntimeError):
    """A rank of a worker group raised or died during ``method``; the group has been stopped."""

    def __init__(self, group: str, rank: int, method: str, cause: BaseException):
        self.group, self.rank, self.method, self.cause = group, rank, method, cause
        detail = str(cause).strip().splitlines()
        super().__init__(f"{group} rank {rank} failed in {method}: {type(cause).__name__}: "
                         f"{detail[-1] if detail else ''} (the {group} worker group was stopped; "
                         f"a restarted run resumes from the newest checkpoint with trainer.resume=auto)")


DEATH_GRACE_S = 5.0
"""How long a raised error waits for another rank's death to be reported (see :func:`_root_cause`)."""


def _root_cause(rank: int, error: Exception, pending: list, rank_of: Mapping) -> tuple[int, Exception]:
    """The failure to report, given the first one (``rank``, ``error``) and the calls still ``pending``.

    When a rank's process dies, its peers' collectives fail at once ("connection closed by peer"), often before
    Ray reports the death itself. So a raised error waits up to :data:`DEATH_GRACE_S` for a pending rank's death,
    and a death, the root cause, is reported instead of its peers' errors.
    """
    import ray

    deadline = time.monotonic() + DEATH_GRACE_S
    while pending and not isinstance(error, ray.exceptions.RayActorError):
        done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            break
        try:
            ray.get(done[0])
        except ray.exceptions.RayActorError as death:
            return rank_of[done[0]], death
        except Exception:  # another raised error: the first one stays the one reported
            pass
    return rank, error


ABANDON_POLL_S = 0.1
"""How often a call that may be abandoned checks whether it should be."""


def _abandoned(group: str, method: str) -> Exception:
    from openmanus_rl_core.process.stopping import Abandoned

    return Abandoned(f"{group}.{method} abandoned: the run is stopping")


def _cancel(refs: list) -> None:
    """Cancel calls still running and wait until they gave up, reading their results so that Ray reports no
    unhandled error for them (the ranks are free for the next call, the checkpoint)."""
    import ray

    for ref in refs:
        ray.cancel(ref)
    for ref in refs:
        try:
            ray.get(ref)
        except Exception:  # TaskCancelledError, or the call's own error: it is given up either way
            pass


class WorkerGroup:
    """``size`` Ray actors of one worker class forming one process group (ranks ``0..size-1``).

    Rank 0 names a free port on its node (MASTER_ADDR/PORT); every rank then joins the process group in
    :meth:`setup` (gloo on CPU, NCCL on GPU). ``call(method)`` runs a method on every rank and returns the results
    in rank order; ``call_each(method, per_rank_args)`` gives each rank its own arguments (its shard).

    A rank that raises or dies fails the call at once (a raise within :data:`DEATH_GRACE_S`): the other ranks may
    be blocked in a collective waiting for it, so the whole group is stopped and the error names the rank, the
    method and the original exception (instead of the driver hanging until the collective's own timeout). A rank
    whose process died is named rather than the peers whose collectives failed because of it.
    """

    def __init__(self, cls: type, size: int, cfg: Config, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 name: str = "worker", placement_strategy: str = "SPREAD", **kwargs: Any):
        import ray

        from openmanus_rl_core.distributed.placement import worker_placement

        if int(size) < 1:
            raise ValueError(f"trainer.num_workers must be >= 1, got {size!r}")
        self.size = int(size)
        self.name = name
        self.workers = []
        # One placement-group bundle per rank: on a cluster SPREAD puts the ranks on different nodes.
        self.placement = worker_placement(self.size, num_cpus, num_gpus, strategy=placement_strategy,
                                          name=f"openmanus_rl_{name}")
        remote = ray.remote(cls)
        self.workers = [
            remote.options(**self.placement.options(rank)).remote(cfg, rank, self.size, **kwargs)
            for rank in range(self.size)
        ]
        try:
            addr, port = ray.get(self.workers[0].free_address.remote())
            self.setup_info = self._gather("setup", [w.setup.remote(addr, port) for w in self.workers])
            self.call("freeze_heap")  # no full garbage collection walks the set-up objects again (Worker)
        except Exception:
            self.kill()
            raise

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self._gather(method, [getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def call_each(self, method: str, per_rank_args: Sequence[tuple], *, abandon: Callable[[], bool] | None = None,
                  **kwargs: Any) -> list:
        """``abandon``: checked while the ranks run; once it is true the calls still running are cancelled (a method
        that checks :func:`openmanus_rl_core.process.stopping.cancelled_call` gives up) and
        :class:`~openmanus_rl_core.process.stopping.Abandoned` is raised."""
        if len(per_rank_args) != self.size:
            raise ValueError(f"{self.name}.{method}: got {len(per_rank_args)} argument sets for {self.size} ranks")
        if abandon is not None and abandon():
            raise _abandoned(self.name, method)
        return self._gather(method, [getattr(w, method).remote(*a, **kwargs)
                                     for w, a in zip(self.workers, per_rank_args)], abandon)

    def _gather(self, method: str, refs: list, abandon: Callable[[], bool] | None = None) -> list:
        """The ranks' results in rank order, failing as soon as any rank fails (see the class docstring)."""
        import ray

        if not self.workers:
            raise RuntimeError(f"{self.name} worker group was stopped after an earlier failure; cannot call {method}")
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=None if abandon is None else ABANDON_POLL_S)
            if not done:
                if abandon():
                    _cancel(pending)
                    raise _abandoned(self.name, method)
                continue
            try:
                ray.get(done[0])
            except Exception as e:
                rank, cause = _root_cause(rank_of[done[0]], e, pending, rank_of)
                self.kill()  # the others may wait in a collective for the failed rank forever
                raise WorkerGroupError(self.name, rank, method, cause) from cause
        return ray.get(refs)

    def kill(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # already gone
                pass
        self.workers = []
        self.placement.remove()
