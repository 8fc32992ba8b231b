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
# module to the next that asks for it while nothing of a test is left on it (a Ray start costs seconds, a command of
# its own more: a new interpreter imports torch again). What a run changes in this process is put back after each
# module (``process_state_kept``).
# The shared Ray is told by its namespace, not by a variable here: the plugins' conftests run this file again.
SHARED_NAMESPACE = "omrl-tests-shared-ray"


def _ray_up():
    """The ``ray`` module when a Ray is connected in this process, else None (imports nothing)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def _shared_ray_idle(ray, wait_s: float = 10.0) -> bool:
    """The Ray up is ``ray_local``'s and nothing holds any of its CPUs (no actor, no placement group left by a
    test); an actor killed a moment ago gives its CPUs back within ``wait_s``."""
    import time

    try:
        if ray.get_runtime_context().namespace != SHARED_NAMESPACE:
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
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _shared_ray_wanted_next(request) -> bool:
    """A later module asks for ``ray_local``."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    return bool(mine) and any("ray_local" in getattr(item, "fixturenames", ()) for item in items[mine[-1] + 1:])


@pytest.fixture(scope="module", autouse=True)
def process_state_kept(request):
    """Each module leaves the process as it found it, whatever its in-process runs changed: the environment (Ray's
    start sets RAY_AUTH_MODE, PYTHONBREAKPOINT and the driver's pid), the working folder, the SIGTERM and SIGINT
    handlers (a run's stop, Ray's), ``print`` (Ray's tqdm replaces it) and torch's thread count (a run's driver
    sets it). A Ray still up afterwards is shut down, unless it is the shared one, idle, and a later module asks
    for it."""
    import builtins
    import signal

    torch = sys.modules.get("torch")
    env, cwd, printer = dict(os.environ), os.getcwd(), builtins.print
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = torch.get_num_threads() if torch is not None else None
    yield
    ray = _ray_up()
    # with none up, Ray still reads its token-auth mode again (a test may have stopped one: test_placement needs a
    # driver of its own)
    if ray is None or not (_shared_ray_wanted_next(request) and _shared_ray_idle(ray)):
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

    if _ray_up() is not None and _shared_ray_idle(ray):
        return
    shut_ray_down()
    env, here = dict(os.environ), os.getcwd()
    os.chdir(REPO)
    try:
        start_ray(None, 2, logging_level="warning", namespace=SHARED_NAMESPACE)
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)


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


# ------------------------------------------------------------------ make test's two workers (pytest-xdist)
# `make test` runs the suite on two worker processes (``-n 2 --dist loadgroup``). Two local Rays starting at once on
# 2 cores time out, so every test that starts or uses a Ray is in one xdist group, run by one worker in collection
# order (its modules share ``ray_local`` there as in a serial run), while the other worker runs the rest, a module at
# a time. Such a test is found by the fixtures it uses, or carries the ``ray`` mark (it starts a Ray itself:
# ``ray.init``, a training command run in a subprocess) or ``cluster``. Each worker's Rays live under a folder of
# their own, so a test outside the group that starts one is caught and named. A test that pip-installs into this
# venv runs alone: every command and registry on the other worker reads the installed entry points.
RAY_GROUP = "ray"
RAY_FIXTURES = {"ray_local", "command_here"}  # in-process runs: they start a Ray or use the module's
VENV_FIXTURES = {"throwaway_dists"}  # installs and uninstalls distributions in this venv while the test runs
# pip-installed for a whole module (openenv's tests): on the Ray worker, so never two pips at once in this venv
ONE_WORKER_FIXTURES = RAY_FIXTURES | VENV_FIXTURES | {"words_package"}


def _worker(config) -> dict | None:
    """xdist's ``workerinput`` in a worker process (``workerid``, ``testrunuid``), else None."""
    return getattr(config, "workerinput", None)


def _on_the_ray_worker(item) -> bool:
    return (ONE_WORKER_FIXTURES & set(getattr(item, "fixturenames", ()))
            or item.get_closest_marker("ray") is not None or item.get_closest_marker("cluster") is not None)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group marks into the test ids
def pytest_collection_modifyitems(config, items):
    """Each test's xdist group: ``ray``, or its module's, so that a module's other tests run in their order on one
    worker, where its module-scoped fixtures (a model a test trains further) are what the next test expects."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = RAY_GROUP if _on_the_ray_worker(item) else item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))


def _ray_tmpdir(worker: dict) -> Path:
    # short: Ray's socket paths under it must stay within the 107 bytes of a Unix socket's name
    import tempfile

    return Path(tempfile.gettempdir()) / f"omrl-ray-{worker['testrunuid'][:8]}-{worker['workerid']}"


def pytest_configure(config):
    worker = _worker(config)
    if worker is not None:
        os.environ["RAY_TMPDIR"] = str(_ray_tmpdir(worker))  # read by every Ray this worker starts, commands' too


def pytest_unconfigure(config):
    worker = _worker(config)
    if worker is not None:
        import shutil

        shutil.rmtree(_ray_tmpdir(worker), ignore_errors=True)


def _ray_sessions() -> set[str]:
    """The Ray sessions this worker has started (each Ray start makes a ``session_<time>_<pid>`` folder)."""
    return {p.name for p in (Path(os.environ["RAY_TMPDIR"]) / "ray").glob("session_2*")}


@pytest.fixture(autouse=True)
def ray_only_on_its_worker(request):
    """Under xdist, a test outside the Ray group that starts a Ray fails, naming what to do."""
    if _worker(request.config) is None or _on_the_ray_worker(request.node):
        yield
        return
    before = _ray_sessions()
    yield
    started = sorted(_ray_sessions() - before)
    if started:
        pytest.fail(f"{request.node.nodeid} started a Ray ({', '.join(started)}) outside the Ray group, so beside "
                    f"the other worker's Ray: mark it @pytest.mark.ray (see tests/conftest.py)", pytrace=False)


@pytest.fixture(autouse=True)
def venv_unchanged_while_a_test_runs(request, tmp_path_factory):
    """Under xdist, a test that pip-installs into this venv (``VENV_FIXTURES``) holds it alone; any other test
    holds it shared. A gate in front keeps the other worker's next tests from starving the installing one."""
    if _worker(request.config) is None:
        yield
        return
    import fcntl

    root = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
    exclusive = bool(VENV_FIXTURES & set(request.fixturenames))
    with open(root / "venv.gate", "a") as gate, open(root / "venv.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
