"""Blocking env calls (reset, step, close) on daemon threads, each with its own timeout."""

from __future__ import annotations

import concurrent.futures as cf
import enum
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


ABANDON_POLL_S = 0.1
"""How often :meth:`EnvCallPool.collect` checks whether to give up its wait (a stop signal)."""


class CallStatus(enum.Enum):
    """How one env call (reset, step, close) run by :class:`EnvCallPool` ended."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


class EnvCallPool:
    """Threads for blocking env calls, each call with its own timeout.

    Why not ``ThreadPoolExecutor``: a hung env call can never be interrupted, and the executor's worker threads
    are joined at interpreter exit, so one env that never answers would hang the process forever. These workers
    are daemon threads; a timed-out call's thread is abandoned (and replaced, so hung envs cannot starve the
    pool). ``max_workers=0``: a new thread whenever every thread is busy.
    """

    def __init__(self, max_workers: int = 0):
        self.max_workers = int(max_workers)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0
        self._abandoned = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        with self._lock:
            self._pending += 1
            cap = self.max_workers + self._abandoned if self.max_workers else math.inf
            spawn = self._pending > self._idle and self._threads < cap
            if spawn:
                self._threads += 1
        self._q.put((fut, fn, args))
        if spawn:
            threading.Thread(target=self._work, name="omrl-env", daemon=True).start()
        return fut

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._q.get()
            with self._lock:
                self._idle -= 1
                if item is None:  # shutdown
                    self._threads -= 1
                    return
                self._pending -= 1
            fut, fn, args = item
            # The thread keeps nothing of a call once it is done: the last reference to an env (or the episode
            # behind a bound method, holding the engine's tensors) would otherwise be dropped when the thread
            # ends, and a daemon thread that frees a torch tensor while the interpreter exits aborts the process
            # ("terminate called without an active exception").
            item = None
            if fut.set_running_or_notify_cancel():
                fut.started_at = time.monotonic()  # type: ignore[attr-defined]
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001  (everything an env raises becomes that episode's error)
                    fut.set_exception(exc)
            fut = fn = args = None

    def shutdown(self) -> None:
        """Let every worker exit once it is free (a hung one when its call returns). Submit no more after this."""
        with self._lock:
            n = self._threads
        for _ in range(n):
            self._q.put(None)

    def harvest(self, futs: Sequence[cf.Future], timeout: float, wait_s: float) -> list[tuple[cf.Future, CallStatus, Any]]:
        """The calls among ``futs`` that ended (or ran past ``timeout`` seconds since they started), waiting at most
        ``wait_s`` seconds for the first one; ``[(future, status, result or exception or None)]`` in end order.

        The non-blocking counterpart of :meth:`collect`, for callers that act on each call as soon as it ends.
        """
        out: list[tuple[cf.Future, CallStatus, Any]] = []
        pending = list(futs)
        end = time.monotonic() + max(wait_s, 0.0)
        while pending:
            now = time.monotonic()
            still = []
            for f in pending:
                s = getattr(f, "started_at", None)
                if f.done():
                    exc = f.exception()
                    out.append((f, CallStatus.ERROR, exc) if exc is not None else (f, CallStatus.OK, f.result()))
                elif s is not None and now >= s + timeout:
                    out.append((f, CallStatus.TIMEOUT, None))
                else:
                    still.append(f)
            if out or now >= end:
                break
            pending = still
            starts = [getattr(f, "started_at", None) for f in still]
            nearest = min((s + timeout for s in starts if s is not None), default=math.inf)
            cf.wait(still, timeout=max(0.0, min(end, nearest, now + 0.05) - now), return_when=cf.FIRST_COMPLETED)
        timed_out = sum(1 for _, st, _ in out if st is CallStatus.TIMEOUT)
        if timed_out:
            with self._lock:
                self._abandoned += timed_out
        return out

    def collect(self, futs: Sequence[cf.Future], timeout: float,
                abandon: Callable[[], bool] | None = None) -> list[tuple[str, Any]]:
        """Wait for every future; each gets ``timeout`` seconds from the moment its call started.

        Returns, in order, ``(CallStatus.OK, result)``, ``(CallStatus.ERROR, exception)`` or
        ``(CallStatus.TIMEOUT, None)``. ``abandon``: checked every :data:`ABANDON_POLL_S` while waiting; once true,
        :class:`~openmanus_rl_core.process.stopping.Abandoned` is raised (the calls go on in their threads, unwaited).
        """
        pending = set(futs)
        timed_out: set[cf.Future] = set()
        while pending:
            if abandon is not None and abandon():
                from openmanus_rl_core.process.stopping import Abandoned

                raise Abandoned("env calls abandoned: the run is stopping")
            now = time.monotonic()
            deadlines = [getattr(f, "started_at", None) for f in pending]
            known = [d + timeout for d in deadlines if d is not None]
            for f in list(pending):
                s = getattr(f, "started_at", None)
                if s is not None and now >= s + timeout and not f.done():
                    pending.discard(f)
                    timed_out.add(f)
            if not pending:
                break
            wait_s = min(known) - now if known else 0.05
            if len(known) < len(deadlines):  # some calls are queued: re-check their start times soon
                wait_s = min(wait_s, 0.05)
            if abandon is not None:
                wait_s = min(wait_s, ABANDON_POLL_S)
            done, _ = cf.wait(pending, timeout=max(wait_s, 0.0), return_when=cf.FIRST_COMPLETED)
            pending -= done
        if timed_out:
            with self._lock:
                self._abandoned += len(timed_out)
        out: list[tuple[str, Any]] = []
        for f in futs:
            if f in timed_out:
                out.append((CallStatus.TIMEOUT, None))
            elif f.exception() is not None:
                out.append((CallStatus.ERROR, f.exception()))
            else:
                out.append((CallStatus.OK, f.result()))
        return out


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception an env call raised."""
    return f"{type(exc).__name__}: {exc}"
