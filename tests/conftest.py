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
