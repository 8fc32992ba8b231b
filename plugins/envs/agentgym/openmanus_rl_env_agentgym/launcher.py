"""Start, health-check, restart and stop AgentGym env servers.

:class:`ServerLauncher` runs N copies of one start command on consecutive ports ``base_port .. base_port+N-1``:

    with ServerLauncher.for_env("textcraft", num_servers=4, base_port=36001) as servers:
        env = AgentGymEnv("textcraft", base_url=servers.next_base_url())   # round-robin over the servers

- The command is a template with ``{port}``, ``{host}`` and ``{python}`` (this interpreter); a string runs
  through ``/bin/sh``, a list runs as argv. Each server runs in its own process group (its own session), so
  stopping it also stops whatever it spawned; its output goes to ``log_dir/<name>_<port>.log``.
- ``start()`` spawns every server, then waits until each answers ``GET health_path`` with HTTP 200 (at most
  ``health_timeout`` seconds; a server that exits meanwhile fails at once, quoting its log's tail).
- ``ensure_alive(port)`` restarts a dead server and waits for it to be healthy; ``start_watchdog(interval)``
  does that for every port from a background thread.
- ``stop()`` (also run at interpreter exit, and by the context manager) sends SIGTERM to each process group,
  then SIGKILL after ``stop_timeout`` seconds. Each server runs under a small guard process
  (:mod:`openmanus_rl_env_agentgym.guard`) that stops it when this process dies without ``stop()`` (kill -9).

``python -m openmanus_rl_env_agentgym.launcher textcraft --num-servers 2`` runs servers until Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import requests

from .spec import get_spec

__all__ = ["LauncherError", "ServerLauncher", "shared_launcher"]

log = logging.getLogger(__name__)


class LauncherError(RuntimeError):
    """A server could not be started, did not become healthy in time, or died and could not be restarted."""


class _Server:
    """One port's process (or a server found already running there, which this launcher does not own)."""

    def __init__(self, port: int):
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.external = False
        self.restarts = 0
        self.lock = threading.RLock()


class ServerLauncher:
    """N env servers from one command template on consecutive ports. See the module docstring.

    Args:
        command: start command template (``{port}``, ``{host}``, ``{python}``); a string (shell) or argv list.
        num_servers: how many servers; ports ``base_port .. base_port + num_servers - 1``.
        base_port: the first port.
        host: the address servers bind to (``{host}``) and clients connect to (``0.0.0.0`` connects as
            ``127.0.0.1``).
        health_path: GET path that answers 200 once a server is up.
        health_timeout: seconds to wait for a (re)started server to become healthy.
        poll_interval: seconds between health polls.
        env: extra environment variables for the servers (added to this process's environment).
        cwd: working directory of the servers.
        log_dir: where server logs go (default: a fresh temporary directory).
        name: label for log files and messages.
        reuse_existing: a port that already answers ``health_path`` is used as is (not owned: never stopped or
            restarted by this launcher); without it, a busy port is an error.
        stop_timeout: seconds between SIGTERM and SIGKILL when stopping.
        max_restarts: restarts allowed per port (None: unlimited).
    """

    def __init__(
        self,
        command: str | Sequence[str],
        num_servers: int = 1,
        base_port: int = 36001,
        host: str = "127.0.0.1",
        *,
        health_path: str = "/",
        health_timeout: float = 120.0,
        poll_interval: float = 0.2,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        log_dir: str | os.PathLike | None = None,
        name: str = "agentgym",
        reuse_existing: bool = False,
        stop_timeout: float = 5.0,
        max_restarts: int | None = None,
    ):
        if not command:
            raise LauncherError(f"{name}: no start command given; pass command='my-server --port {{port}}'")
        if int(num_servers) < 1:
            raise LauncherError(f"{name}: num_servers must be >= 1, got {num_servers}")
        if not 0 < int(base_port) <= 65535 - int(num_servers) + 1:
            raise LauncherError(f"{name}: base_port {base_port} with {num_servers} servers leaves the port range")
        self.command = command if isinstance(command, str) else list(command)
        self.num_servers = int(num_servers)
        self.base_port = int(base_port)
        self.host = host
        self.connect_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        self.health_path = health_path if health_path.startswith("/") else "/" + health_path
        self.health_timeout = float(health_timeout)
        self.poll_interval = float(poll_interval)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.cwd = None if cwd is None else str(cwd)
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"{name}-servers-"))
        self.name = name
        self.reuse_existing = reuse_existing
        self.stop_timeout = float(stop_timeout)
        self.max_restarts = max_restarts
        self._servers = {p: _Server(p) for p in self.ports}
        self._rr = itertools.count()
        self._rr_lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._watchdog_stop = threading.Event()
        self._started = False
        self._http = threading.local()

    @classmethod
    def for_env(cls, env_name: str, **overrides: Any) -> "ServerLauncher":
        """A launcher configured from the env's spec (``command``, ``default_port``, ``health_path``,
        ``health_timeout``); keyword arguments override them (``command``, ``num_servers``, ``base_port``, ...)."""
        spec = get_spec(env_name)
        kw: dict[str, Any] = {
            "command": spec.command,
            "base_port": spec.default_port,
            "health_path": spec.health_path,
            "health_timeout": spec.health_timeout,
            "name": env_name,
        }
        kw.update({k: v for k, v in overrides.items() if v is not None})
        if not kw.get("command"):
            raise LauncherError(f"AgentGym env {env_name!r} has no start command in envs.yaml; pass command=...")
        return cls(**kw)

    # ---------------------------------------------------------------------------------------- addresses
    @property
    def ports(self) -> list[int]:
        return [self.base_port + i for i in range(self.num_servers)]

    @property
    def urls(self) -> list[str]:
        return [self.url(p) for p in self.ports]

    def url(self, port: int) -> str:
        return f"http://{self.connect_host}:{port}"

    def next_base_url(self) -> str:
        """The next server's URL, round-robin (thread-safe); restarts that server first if it is dead."""
        with self._rr_lock:
            i = next(self._rr)
        port = self.ports[i % self.num_servers]
        if self._started:
            self.ensure_alive(port)
        return self.url(port)

    def assign(self, n: int) -> list[str]:
        """Server URLs for ``n`` envs, round-robin from the first server: env ``i`` gets server ``i % N``."""
        return [self.urls[i % self.num_servers] for i in range(n)]

    def pid(self, port: int) -> int | None:
        """The server process's id (= its process group id); None when not running or not owned."""
        proc = self._server(port).proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def log_path(self, port: int) -> Path:
        return self.log_dir / f"{self.name}_{port}.log"

    # -------------------------------------------------------------------------------------- lifecycle
    def start(self) -> "ServerLauncher":
        """Start every server and wait until all are healthy; on failure stop them all and raise LauncherError."""
        if self._started:
            return self
        atexit.register(self.stop)
        self._started = True
        try:
            for port in self.ports:
                with self._server(port).lock:
                    self._spawn_or_adopt(port)
            deadline = time.monotonic() + self.health_timeout
            for port in self.ports:
                self._wait_healthy(port, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("%s: %d server(s) up at %s", self.name, self.num_servers, ", ".join(self.urls))
        return self

    def stop(self) -> None:
        """Stop the watchdog and every server this launcher started (process groups: SIGTERM, then SIGKILL)."""
        self._started = False
        self._watchdog_stop.set()
        wd = self._watchdog
        if wd is not None and wd is not threading.current_thread():
            wd.join(timeout=self.stop_timeout + 1)
        self._watchdog = None
        for server in self._servers.values():
            with server.lock:
                self._kill(server)
                server.external = False
        try:
            atexit.unregister(self.stop)
        except Exception:  # interpreter shutting down
            pass

    def __enter__(self) -> "ServerLauncher":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ health
    def is_alive(self, port: int) -> bool:
        """Whether the server on ``port`` is running (its process has not exited; an adopted one answers health)."""
        server = self._server(port)
        if server.external:
            return self.healthy(port)
        return server.proc is not None and server.proc.poll() is None

    def healthy(self, port: int, timeout: float = 2.0) -> bool:
        """Whether ``GET health_path`` on ``port`` answers HTTP 200."""
        session = getattr(self._http, "session", None)
        if session is None:
            session = self._http.session = requests.Session()
            session.trust_env = False
        try:
            return session.get(self.url(port) + self.health_path, timeout=(timeout, timeout)).status_code == 200
        except requests.RequestException:
            return False

    def ensure_alive(self, port: int) -> bool:
        """Restart the server on ``port`` if it died, and wait until it is healthy.

        Returns True if it was restarted, False if it was running. Raises LauncherError if it cannot be restarted.
        """
        server = self._server(port)
        with server.lock:
            if not self._started:
                raise LauncherError(f"{self.name}: ensure_alive({port}) on a launcher that is not started")
            if self.is_alive(port):
                return False
            if self.max_restarts is not None and server.restarts >= self.max_restarts:
                raise LauncherError(
                    f"{self.name}: server on port {port} died again after {server.restarts} restarts "
                    f"(max_restarts={self.max_restarts}); see {self.log_path(port)}"
                )
            rc = server.proc.poll() if server.proc is not None else None
            log.warning("%s: server on port %d is down (exit code %s); restarting", self.name, port, rc)
            self._kill(server)  # reap it and anything left in its process group
            server.external = False
            server.restarts += 1
            self._spawn_or_adopt(port)
            self._wait_healthy(port, time.monotonic() + self.health_timeout)
            return True

    def start_watchdog(self, interval: float = 1.0) -> None:
        """Check every server each ``interval`` seconds from a daemon thread; restart dead ones."""
        if self._watchdog is not None and self._watchdog.is_alive():
            return
        self._watchdog_stop.clear()

        def watch() -> None:
            while not self._watchdog_stop.wait(interval):
                for port in self.ports:
                    if self._watchdog_stop.is_set():
                        return
                    try:
                        self.ensure_alive(port)
                    except LauncherError as exc:
                        if not self._watchdog_stop.is_set():  # stop() racing a check is not news
                            log.error("%s watchdog: %s", self.name, exc)
                    except Exception:  # keep watching the other servers
                        log.exception("%s watchdog: unexpected error on port %d", self.name, port)

        self._watchdog = threading.Thread(target=watch, name=f"{self.name}-watchdog", daemon=True)
        self._watchdog.start()

    # --------------------------------------------------------------------------------------- internals
    def _server(self, port: int) -> _Server:
        try:
            return self._servers[port]
        except KeyError:
            raise LauncherError(f"{self.name}: port {port} is not one of this launcher's ports {self.ports}") from None

    def _render(self, port: int) -> str | list[str]:
        values = {"port": port, "host": self.host, "python": sys.executable}
        if isinstance(self.command, str):
            return self.command.format(**values)
        return [part.format(**values) for part in self.command]

    def _port_in_use(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            return s.connect_ex((self.connect_host, port)) == 0

    def _spawn_or_adopt(self, port: int) -> None:
        server = self._servers[port]
        if self._port_in_use(port):
            if self.reuse_existing and self.healthy(port):
                server.external = True
                log.info("%s: reusing the server already running on port %d", self.name, port)
                return
            raise LauncherError(
                f"{self.name}: port {port} is already in use; stop what listens there or choose another base_port"
                + ("" if self.reuse_existing else " (or pass reuse_existing=True to use a healthy server there)")
            )
        cmd = self._render(port)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(port), "ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} starting: {cmd}\n".encode())
            out.flush()
            argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
            # The guard stops the server if this process dies without stop() (SIGKILL): no orphaned servers.
            guarded = [sys.executable, "-m", "openmanus_rl_env_agentgym.guard", str(os.getpid()), "--", *argv]
            try:
                server.proc = subprocess.Popen(
                    guarded,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stop() kills the server and its children
                    env={**os.environ, **self.env},
                    cwd=self.cwd,
                )
            except OSError as exc:
                raise LauncherError(f"{self.name}: cannot start {cmd!r} for port {port}: {exc}") from exc
        server.external = False
        log.info("%s: started pid %d on port %d: %s", self.name, server.proc.pid, port, cmd)

    def _wait_healthy(self, port: int, deadline: float) -> None:
        server = self._servers[port]
        while True:
            if server.external:
                if self.healthy(port):
                    return
            else:
                proc = server.proc
                rc = proc.poll() if proc is not None else -1
                if rc is not None:
                    raise LauncherError(
                        f"{self.name}: server on port {port} exited with code {rc} before becoming healthy; "
                        f"last log lines ({self.log_path(port)}):\n{self._log_tail(port)}"
                    )
                if self.healthy(port, timeout=min(2.0, max(0.2, deadline - time.monotonic()))):
                    return
            if time.monotonic() >= deadline:
                raise LauncherError(
                    f"{self.name}: server on port {port} did not answer GET {self.health_path} with 200 within "
                    f"{self.health_timeout:g}s; raise health_timeout or check {self.log_path(port)}:\n"
                    f"{self._log_tail(port)}"
                )
            time.sleep(self.poll_interval)

    def _kill(self, server: _Server) -> None:
        proc, server.proc = server.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, self.stop_timeout)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # the group is gone already
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children that outlived the group leader
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # The leader is the guard: when the group was killed at once (SIGKILL), the server below it may still be
        # closing its socket. A restart on this port must not find it taken.
        deadline = time.monotonic() + self.stop_timeout
        while self._port_in_use(server.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _log_tail(self, port: int, lines: int = 15) -> str:
        try:
            text = self.log_path(port).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------- shared launchers
_SHARED: dict[tuple, ServerLauncher] = {}
_SHARED_LOCK = threading.Lock()


def shared_launcher(env_name: str, *, host: str = "127.0.0.1", base_port: int | None = None, num_servers: int = 1,
                    **options: Any) -> ServerLauncher:
    """The process-wide started launcher for ``(env_name, host, base_port, num_servers)``, started on first use.

    Used by the env factories' ``autostart=True``. A server already healthy on a port is reused, not restarted
    (another worker process may have started it). A watchdog thread restarts dead servers.
    """
    spec = get_spec(env_name)
    port = int(base_port if base_port is not None else spec.default_port)
    key = (env_name, host, port, int(num_servers))
    with _SHARED_LOCK:
        launcher = _SHARED.get(key)
        if launcher is None:
            watchdog_interval = float(options.pop("watchdog_interval", 2.0))
            options.setdefault("reuse_existing", True)
            launcher = ServerLauncher.for_env(env_name, host=host, base_port=port, num_servers=num_servers, **options)
            launcher.start()
            launcher.start_watchdog(watchdog_interval)
            _SHARED[key] = launcher
        return launcher


def main(argv: Sequence[str] | None = None) -> int:
    """Run an env's servers in the foreground until interrupted."""
    p = argparse.ArgumentParser(prog="python -m openmanus_rl_env_agentgym.launcher", description=main.__doc__)
    p.add_argument("env", help="AgentGym env name (textcraft, babyai, webshop, ...)")
    p.add_argument("--num-servers", type=int, default=1)
    p.add_argument("--base-port", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--command", default=None, help="start command template with {port} (default: from envs.yaml)")
    p.add_argument("--health-timeout", type=float, default=None)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--watchdog-interval", type=float, default=2.0)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    launcher = ServerLauncher.for_env(a.env, num_servers=a.num_servers, base_port=a.base_port, host=a.host,
                                      command=a.command, health_timeout=a.health_timeout, log_dir=a.log_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with launcher:
        launcher.start_watchdog(a.watchdog_interval)
        print("servers:", " ".join(launcher.urls), f"(logs in {launcher.log_dir})", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
