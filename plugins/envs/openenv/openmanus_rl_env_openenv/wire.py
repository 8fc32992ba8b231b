"""What the env's calls share without importing openenv-core (whose import brings gradio and takes seconds): the
server's error as an exception, one event loop per process for every session (:func:`run`), and plain HTTP GETs.

Every session of a process runs on one background event loop: the env's blocking calls hand it their coroutine and
wait, so a batch of episodes costs one thread, not one per episode.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Coroutine, Mapping

import requests

__all__ = ["ServerError", "run", "get_json", "CAPACITY", "VALIDATION"]

CAPACITY = "CAPACITY_REACHED"
VALIDATION = "VALIDATION_ERROR"


class ServerError(RuntimeError):
    """The server answered a message with an error: ``code`` (openenv's ``WSErrorCode``) and ``data``."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = dict(data)
        self.code = str(self.data.get("code", "UNKNOWN"))
        super().__init__(f"{self.data.get('message', 'server error')} (code: {self.code})")


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        threading.Thread(target=self.loop.run_forever, name="openenv-sessions", daemon=True).start()


_LOOP: _Loop | None = None
_LOOP_LOCK = threading.Lock()


def run(coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
    """Run ``coro`` on this process's session loop and wait for its result (at most ``timeout`` seconds)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.pid != os.getpid():  # a forked child starts its own
            _LOOP = _Loop()
        loop = _LOOP.loop
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


_HTTP = threading.local()


def get_json(url: str, timeout: float) -> Any:
    """``GET url`` as JSON (no proxy: the servers are local or named by the user); raises on any failure."""
    session = getattr(_HTTP, "session", None)
    if session is None:
        session = _HTTP.session = requests.Session()
        session.trust_env = False
    response = session.get(url, timeout=timeout)
    response.raise_for_status()
    return response.json()
