"""The OpenEnv servers the plugin starts itself: one env app served by uvicorn on free loopback ports.

Each server is ``python -m openmanus_rl_env_openenv.serve <app> --port P`` under the core's guard
(:func:`openmanus_rl_core.process.guard.guarded`), in its own process group: :meth:`ServerPool.stop` ends the group,
and the guard ends it when the process that started it (the trainer's driver) dies without stopping it (kill -9).
A watchdog thread restarts a server that exits, on the same port (the envs know the servers by URL). Each server's
output goes to ``<log_dir>/openenv_<port>.log``, with a ``=== starting`` line per start.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping

import requests
from openmanus_rl_core.process.guard import guarded

__all__ = ["ServerPool", "ServerStartError", "healthy"]

log = logging.getLogger(__name__)
STOP_GRACE_S = 5.0
POLL_S = 0.1


class ServerStartError(RuntimeError):
    """A server exited before answering ``/health``, or did not answer it in time."""


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether ``GET url/health`` answers 200."""
    try:
        with requests.Session() as s:
            s.trust_env = False
            return s.get(url.rstrip("/") + "/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class _Server:
    def __init__(self, port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.lock = threading.RLock()


class ServerPool:
    """Servers of one app (``module:attr``); ``env``: extra environment variables for them."""

    def __init__(self, app: str, *, health_timeout_s: float, env: Mapping[str, object] | None = None,
                 log_dir: str | os.PathLike | None = None):
        self.app = app
        self.health_timeout_s = float(health_timeout_s)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="openenv-servers-"))
        self.servers: list[_Server] = []
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        atexit.register(self.stop)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def pids(self) -> list[int]:
        """The running servers' process-group leaders (their guards)."""
        return [s.proc.pid for s in self.servers if s.proc is not None and s.proc.poll() is None]

    def log_path(self, port: int) -> Path:
        return self.log_dir / f"openenv_{port}.log"

    # ------------------------------------------------------------------------------------------------ starting
    def add(self, n: int) -> list[str]:
        """Start ``n`` more servers and wait until each answers ``/health``; their URLs."""
        new = [_Server(p) for p in _free_ports(n)]
        self.servers.extend(new)
        for server in new:
            self._spawn(server)
        with ThreadPoolExecutor(max_workers=min(len(new), 16) or 1) as pool:
            list(pool.map(self._wait_healthy, new))
        return [s.url for s in new]

    def _spawn(self, server: _Server) -> None:
        argv = [sys.executable, "-m", "openmanus_rl_env_openenv.serve", self.app, "--port", str(server.port)]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(server.port), "ab") as out:
            out.write(f"=== starting {time.strftime('%H:%M:%S')}: {' '.join(argv)}\n".encode())
            out.flush()
            server.proc = subprocess.Popen(guarded(argv), stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           env={**os.environ, **self.env})
        server.starts += 1

    def _wait_healthy(self, server: _Server) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        while True:
            proc = server.proc
            if proc is None or proc.poll() is not None:
                raise ServerStartError(f"the server of {self.app} on port {server.port} exited (code "
                                       f"{None if proc is None else proc.returncode}) before answering /health; "
                                       f"its log ({self.log_path(server.port)}) ends: {self._tail(server.port)}")
            if healthy(server.url, timeout=1.0):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"the server of {self.app} on port {server.port} did not answer /health "
                                       f"within {self.health_timeout_s:g}s (env.kwargs.health_timeout_s); its log "
                                       f"({self.log_path(server.port)}) ends: {self._tail(server.port)}")
            time.sleep(POLL_S)

    def _tail(self, port: int, lines: int = 3) -> str:
        try:
            text = self.log_path(port).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(x.strip() for x in text[-lines:] if x.strip())

    # ---------------------------------------------------------------------------------------------- restarting
    def ensure_alive(self) -> None:
        """Restart every server that exited and wait until it answers again (also waits for a restart the watchdog
        has under way); raises :class:`ServerStartError` when one cannot be brought back."""
        for server in self.servers:
            with server.lock:
                deadline = time.monotonic() + self.health_timeout_s
                while not self._stopping.is_set():
                    proc = server.proc
                    if proc is None or proc.poll() is not None:  # exited (a dying one is waited for below)
                        log.warning("openenv: the server on port %d exited (code %s); restarting it", server.port,
                                    None if proc is None else proc.returncode)
                        self._kill(server)
                        free_by = time.monotonic() + STOP_GRACE_S
                        while _port_taken(server.port) and time.monotonic() < free_by:
                            time.sleep(POLL_S)
                        self._spawn(server)
                        self._wait_healthy(server)
                        break
                    if healthy(server.url, timeout=1.0):
                        break
                    if time.monotonic() > deadline:
                        raise ServerStartError(f"the server of {self.app} on port {server.port} runs but has not "
                                               f"answered /health for {self.health_timeout_s:g}s; its log "
                                               f"({self.log_path(server.port)}) ends: {self._tail(server.port)}")
                    time.sleep(POLL_S)

    def start_watchdog(self, interval: float = 0.5) -> None:
        """Restart exited servers from a daemon thread, every ``interval`` seconds."""
        if self._watchdog is not None:
            return

        def watch() -> None:
            while not self._stopping.wait(interval):
                if any(s.proc is None or s.proc.poll() is not None for s in self.servers):
                    try:
                        self.ensure_alive()
                    except Exception as exc:  # noqa: BLE001  (keep watching; the run's env-error watch decides)
                        if not self._stopping.is_set():
                            log.error("openenv watchdog: %s", exc)

        self._watchdog = threading.Thread(target=watch, name="openenv-watchdog", daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------------------------------------------ stopping
    @staticmethod
    def _signal(server: _Server, sig: int) -> None:
        if server.proc is not None:
            try:
                os.killpg(server.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill(self, server: _Server) -> None:
        proc, server.proc = server.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def stop(self) -> None:
        """Stop every server (SIGTERM to each process group, SIGKILL after a grace period) and the watchdog."""
        self._stopping.set()
        for server in self.servers:
            self._signal(server, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for server in self.servers:
            with server.lock:
                proc = server.proc
                if proc is not None:
                    try:
                        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                    self._kill(server)
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=2.0)
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001  (interpreter shutting down)
            pass
