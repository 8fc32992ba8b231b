"""The AgentGym client's answer handling at its limits, against a one-file HTTP server that answers each request
with a body the test chose: an error body is quoted, a chunked body is bounded in total, JSON depth is exact."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openmanus_rl_env_agentgym.client import AgentGymEnv, EnvServerError


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked transfer encoding needs 1.1

    def do_POST(self):  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = self.server.chunks  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")  # no Content-Length: only the running total can tell
        self.end_headers()
        for piece in chunks:
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
            time.sleep(0.05)  # each chunk arrives on its own
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.chunks = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _env(server, **kwargs) -> AgentGymEnv:
    return AgentGymEnv("textcraft", base_url=f"http://127.0.0.1:{server.server_address[1]}", timeout=5, retries=0,
                       **kwargs)


def _answer(server, value, pieces: int = 1) -> bytes:
    body = json.dumps(value).encode()
    step = -(-len(body) // pieces)
    server.chunks = [body[i:i + step] for i in range(0, len(body), step)]
    return body


def test_an_error_body_is_quoted_in_the_error(server):
    _answer(server, {"error": "env 7 does not exist (it was closed)"})
    env = _env(server)
    with pytest.raises(EnvServerError) as err:
        env._request("POST", "/step", {"action": "look"})
    assert err.value.message == "POST /step: server error: env 7 does not exist (it was closed)"
    assert err.value.url == env.url + "/step"


def test_a_chunked_body_over_max_response_bytes_in_total_is_refused(server):
    value = {"observation": "x" * 100, "reward": 0, "done": False}
    body = _answer(server, value, pieces=6)
    assert max(map(len, server.chunks)) < 30 < len(body)  # every chunk is under the limit, the whole is not
    with pytest.raises(EnvServerError, match="answer is over max_response_bytes=30"):
        _env(server, max_response_bytes=30)._request("POST", "/step", {"action": "look"})
    # The same chunks with room for them: the whole answer, joined.
    assert _env(server, max_response_bytes=len(body))._request("POST", "/step", {"action": "look"}) == value


def test_json_exactly_at_max_json_depth_is_accepted_and_one_level_deeper_refused(server):
    at_limit = {"observation": "o", "info": [[1]]}  # object, list, list: depth 3
    _answer(server, at_limit)
    assert _env(server, max_json_depth=3)._request("POST", "/step", {}) == at_limit
    _answer(server, {"observation": "o", "info": [[[1]]]})  # depth 4
    with pytest.raises(EnvServerError, match="nested deeper than max_json_depth=3"):
        _env(server, max_json_depth=3)._request("POST", "/step", {})
