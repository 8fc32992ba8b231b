"""Shared by the openenv plugin's tests: the Words env (``openenv_words/``, written with openenv-core's own
``Environment`` and ``create_app``) pip-installed for real as the distribution ``openenv-omrl-words``, a server of it
started the way a user starts one (uvicorn, not the plugin), and process checks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORDS_SRC = HERE / "openenv_words"
WORDS_DIST = "openenv-omrl-words"
WORDS_APP = "omrl_words_env.server.app:app"
BIN = Path(sys.executable).parent
WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "green"]  # its word list


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def words_package(tmp_path_factory):
    """``openenv-omrl-words`` installed into this venv (no dependencies, no index; a copy of the source, so the
    build leaves nothing in the repository), uninstalled after the module."""
    root = tmp_path_factory.mktemp("words") / "openenv_words"
    shutil.copytree(WORDS_SRC, root, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    result = pip("install", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(root))
    assert result.returncode == 0, result.stderr
    yield WORDS_DIST
    pip("uninstall", "-y", "-q", WORDS_DIST)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate, timeout: float, what: str, poll: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


class UserServer:
    """The Words app served as a user serves it: ``uvicorn omrl_words_env.server.app:app --port P``."""

    def __init__(self, sessions: int = 8):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(BIN / "uvicorn"), WORDS_APP, "--host", "127.0.0.1", "--port", str(self.port), "--log-level",
             "warning"], env={**os.environ, "WORDS_SESSIONS": str(sessions)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        from openmanus_rl_env_openenv.servers import healthy

        wait_for(lambda: healthy(self.url) or self.proc.poll() is not None, 120, "the user's server")
        assert self.proc.poll() is None, "uvicorn exited"

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
