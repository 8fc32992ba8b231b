"""A small OpenAI-compatible HTTP server for tests, run on a thread: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``. Its replies come from ``reply(body) -> str``; ``faults`` (a list consumed one per request)
injects failures: ``("status", code, headers, body)``, ``("sleep", seconds)``, ``("raw", bytes)`` (a body that is not
JSON), ``("trickle", seconds_between_bytes)`` (a body that never ends), ``("json", obj)`` (any JSON answer)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class FakeOpenAI:
    def __init__(self, reply: Callable[[dict], str], model: str = "served", key: str | None = None,
                 stop_reason: bool = False):
        self.reply, self.model, self.key, self.stop_reason = reply, model, key, stop_reason
        self.faults: list[tuple] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []  # of each POST
        self.get_headers: list[dict] = []  # of each GET (/models)
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, payload: bytes, headers: dict | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                with server.lock:
                    server.get_headers.append(dict(self.headers))
                if server.key and self.headers.get("Authorization") != f"Bearer {server.key}":
                    return self._send(401, b'{"error": "bad key"}')
                self._send(200, json.dumps({"object": "list", "data": [{"id": server.model}]}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server.lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    fault = server.faults.pop(0) if server.faults else None
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(body, fault)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _answer(self, body: dict, fault: tuple | None) -> None:
                if server.key and self.headers.get("Authorization") != f"Bearer {server.key}":
                    return self._send(401, b'{"error": "bad key"}')
                kind = fault[0] if fault else None
                if kind == "status":
                    return self._send(fault[1], fault[3].encode(), fault[2])
                if kind == "raw":
                    return self._send(200, fault[1])
                if kind == "json":
                    return self._send(200, json.dumps(fault[1]).encode())
                if kind == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    try:  # for 10 s, then it stops short: a client without a deadline fails then, not hangs
                        for _ in range(int(10 / fault[1])):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(fault[1])
                    except OSError:
                        pass
                    return
                if kind == "sleep":
                    time.sleep(fault[1])
                text = server.reply(body)
                finish, matched = "stop", None
                for s in body.get("stop") or []:  # OpenAI semantics: the reply ends before the stop string
                    if s in text:
                        text, matched = text[: text.index(s)], s
                        break
                if self.path.endswith("/chat/completions"):
                    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": text, "finish_reason": finish}
                if server.stop_reason:
                    choice["stop_reason"] = matched
                self._send(200, json.dumps({"id": "x", "object": "text_completion", "choices": [choice]}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def key_door_oracle(tokenizer: Any) -> Callable[[dict], str]:
    """Replies of an expert at key_door (react tags): ``say <the word the note showed>`` once the box is open, else
    ``open box``. Reads the prompt as text, token ids or chat messages."""
    import re

    def reply(body: dict) -> str:
        if "messages" in body:
            text = "\n".join(m["content"] for m in body["messages"])
        elif isinstance(body.get("prompt"), list):
            text = tokenizer.decode(body["prompt"], skip_special_tokens=False)
        else:
            text = str(body.get("prompt"))
        notes = re.findall(r"The note says: (\w+)\.", text)
        return f"<action>say {notes[-1]}</action>" if notes else "<action>open box</action>"

    return reply
