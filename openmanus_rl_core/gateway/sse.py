"""Server-sent events, the wire format of every streamed reply (chat chunks, Responses events, Messages events)."""

from __future__ import annotations

import json
from typing import Any


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``data`` as JSON (or as given, when a string)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()
