import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def cli_env():
    """Environment for running the console script in a subprocess, from the same venv as the tests."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    return env


class ThrowawayDists:
    """Throwaway distributions written under a temporary folder and pip-installed into this venv for real (no
    dependencies, no index), so entry points go through importlib-metadata as a user's plugin would."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.installed: list[str] = []

    @staticmethod
    def pip(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)

    def install(self, dist: str, files: dict[str, str]) -> Path:
        """Write ``files`` (path relative to the distribution's root -> text) and install it; returns the root."""
        root = self.folder / dist
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        result = self.pip("install", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(root))
        assert result.returncode == 0, result.stderr
        self.installed.append(dist)
        return root

    def uninstall(self, dist: str) -> subprocess.CompletedProcess:
        if dist in self.installed:
            self.installed.remove(dist)
        return self.pip("uninstall", "-y", "-q", dist)


@pytest.fixture
def throwaway_dists(tmp_path):
    """Install throwaway distributions with ``.install(dist, files)``; whatever is still installed at the end of
    the test is uninstalled."""
    dists = ThrowawayDists(tmp_path)
    try:
        yield dists
    finally:
        for dist in list(dists.installed):
            dists.uninstall(dist)


# ------------------------------------------------------------------ in-process runs and the process they share
# A run started in this process (``train``, ``cli.main``, ``omrl.train``) reuses a Ray that is already up, so the
# modules that train in this process share one: ``ray_local`` starts it (or finds it up), and it stays up from one
# module of tests/ to the next while nothing of a test is left on it (a Ray start costs seconds, a command of
# its own more: a new interpreter imports torch again). What a run changes in this process is put back after each
# module (``process_state_kept``).
_SHARED: dict = {"node": None}  # the node id of the Ray ``ray_local`` started, while it is up


def _ray_up():
    """The ``ray`` module when a Ray is connected in this process, else None (imports nothing)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def _shared_ray_idle(ray, wait_s: float = 10.0) -> bool:
    """The Ray up is ``ray_local``'s and nothing holds any of its CPUs (no actor, no placement group left by a
    test); an actor killed a moment ago gives its CPUs back within ``wait_s``."""
    import time

    try:
        if ray.get_runtime_context().get_node_id() != _SHARED["node"]:
            return False
        deadline = time.monotonic() + wait_s
        while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True
    except Exception:  # a Ray that does not answer is not kept
        return False


def shut_ray_down() -> None:
    """Stop the Ray connected in this process (if any), then let Ray read its token-auth mode again: a local Ray
    turns token mode on in the driver's cached config and token, and a later driver of this process (another
    cluster's, with token auth off) must speak what its cluster speaks. Ray's own tests reset it so."""
    ray = _ray_up()
    if ray is not None:
        ray.shutdown()
    _SHARED["node"] = None
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _in_tests(item) -> bool:
    return Path(str(item.path)).resolve().parent == REPO / "tests"


def _shared_ray_wanted_next(request) -> bool:
    """A later module of tests/ asks for ``ray_local`` and every module up to it is in tests/ (a plugin's module,
    or a module of the plugins' tests, never finds the shared Ray up)."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    for item in items[mine[-1] + 1:] if mine else []:
        if not _in_tests(item):
            return False
        if "ray_local" in getattr(item, "fixturenames", ()):
            return True
    return False


@pytest.fixture(scope="module", autouse=True)
def process_state_kept(request):
    """Each module leaves the process as it found it, whatever its in-process runs changed: the environment (Ray's
    start sets RAY_AUTH_MODE, PYTHONBREAKPOINT and the driver's pid), the working folder, the SIGTERM and SIGINT
    handlers (a run's stop, Ray's), ``print`` (Ray's tqdm replaces it) and torch's thread count (a run's driver
    sets it). A Ray still up afterwards is shut down, unless it is the shared one, idle, and a module of tests/
    that comes next (with only tests/ modules before it) asks for it."""
    import builtins
    import signal

    torch = sys.modules.get("torch")
    env, cwd, printer = dict(os.environ), os.getcwd(), builtins.print
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = torch.get_num_threads() if torch is not None else None
    yield
    ray = _ray_up()
    if ray is not None and not (_shared_ray_wanted_next(request) and _shared_ray_idle(ray)):
        shut_ray_down()
    elif ray is None and _SHARED["node"] is not None:  # stopped by a test (test_placement needs a driver of its own)
        shut_ray_down()
    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    builtins.print = printer
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    if threads is not None:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def no_ray_after_the_session():
    """The shared Ray, if the last module left it up, stops with the session."""
    yield
    if _ray_up() is not None:
        shut_ray_down()


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray for the module's in-process runs (see above): started as a run starts its own (loopback only,
    2 CPUs), in the repository's root, which Ray puts on its workers' ``sys.path`` (``examples.key_door_agent:play``
    imports there). The environment its start sets is put back at once: the module's subprocesses start their own
    Ray, as a user's command does. Any other Ray up is stopped first."""
    ray = pytest.importorskip("ray")
    from openmanus_rl_core.distributed.ray_node import start_ray

    if _ray_up() is not None and _SHARED["node"] is not None and _shared_ray_idle(ray):
        return
    shut_ray_down()
    env, here = dict(os.environ), os.getcwd()
    os.chdir(REPO)
    try:
        start_ray(None, 2, logging_level="warning")
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
    _SHARED["node"] = ray.get_runtime_context().get_node_id()


class CommandHere:
    """``openmanus-rl <args>`` run in this process (``cli.main``, the console script's function), its output read
    from the file descriptors: ``.returncode``, ``.stdout`` and ``.stderr`` as a subprocess gives them, without a
    second interpreter's start-up (and, under ``ray_local``, its own Ray node). An exception the command lets out
    is raised here (a subprocess would print its traceback and exit 1)."""

    def __init__(self, capfd):
        self.capfd = capfd

    def __call__(self, args: list[str]):
        from types import SimpleNamespace

        from openmanus_rl_core.cli import main

        self.capfd.readouterr()  # what came before is not this command's
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        out = self.capfd.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.fixture
def command_here(capfd):
    """Run ``openmanus-rl`` in this process: ``command_here(["train", ...])`` (see :class:`CommandHere`)."""
    return CommandHere(capfd)


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module: a tiny model's steps are too small to split across threads, and on a busy
    CPU extra threads only spin-wait. Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dist_group():
    """One process group of one rank for every worker of this module (gloo, a free local port)."""
    import socket

    import torch.distributed as dist

    from openmanus_rl_core.distributed.ray_node import local_store_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    local_store_path(port).unlink(missing_ok=True)  # a killed run's rendezvous file for this port would hang it
    yield ("127.0.0.1", port)
    if dist.is_initialized():
        dist.destroy_process_group()
