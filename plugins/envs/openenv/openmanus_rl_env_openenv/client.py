"""WebSocket sessions with OpenEnv servers through openenv-core's own client.

:class:`Session` is openenv-core's :class:`~openenv.core.generic_client.GenericEnvClient` (its ``/ws`` messages:
``reset``, ``step``, ``state``, ``close``; its result parsing), with two changes: a server's error reply raises
:class:`~openmanus_rl_env_openenv.wire.ServerError` carrying the server's code and details (a refused action's
validation errors, a full server's ``CAPACITY_REACHED``) instead of a bare ``RuntimeError``; and the socket skips
compression and proxies (loopback servers). Sessions run on the process's one event loop
(:func:`openmanus_rl_env_openenv.wire.run`).

Importing openenv-core takes seconds (its ``openenv.core`` package imports its server side, gradio included): the
env imports this module on its first session, not when a command checks its settings.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from openenv.core.generic_client import GenericEnvClient
from openmanus_rl_core.process import heap
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from openmanus_rl_env_openenv.wire import ServerError

__all__ = ["Session"]

# openenv-core's import leaves ~220k long-lived objects (gradio's among them): every later full collection of the
# cyclic garbage collector would walk them (119 ms on 2 cores), a pause that lands on a rollout's turn. Hidden from it
# once, as the trainer hides its own set-up (openmanus_rl_core.process.heap).
heap.freeze()


class Session(GenericEnvClient):
    """One WebSocket session: one env instance on the server, from the first message until ``disconnect()``."""

    async def connect(self) -> "Session":
        if self._ws is None:
            try:
                self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                            max_size=self._max_message_size, compression=None, proxy=None)
            except Exception as exc:  # noqa: BLE001  (refused, reset, timed out: one message names the url)
                raise ConnectionError(f"cannot connect to {self._ws_url}: {exc}") from exc
        return self

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        await self._ensure_connected()
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            pass  # a server that refused the session (full) closed it after saying why: read that below
        try:
            raw = await asyncio.wait_for(self._ws.recv(), timeout=self._message_timeout)
        except ConnectionClosed as exc:
            raise ConnectionError(f"the server at {self._ws_url} closed the session ({exc})") from None
        response = json.loads(raw)
        if response.get("type") == "error":
            raise ServerError(response.get("data") or {})
        return response
