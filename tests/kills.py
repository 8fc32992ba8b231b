"""Killing a run with kill -9 at a chosen moment (the kill / resume tests), and telling whether the processes it left
have gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_once_written(cmd: list[str], path: Path, env: dict) -> None:
    """Start ``cmd`` and kill -9 its whole process group (driver, Ray, workers) as soon as ``path`` exists."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before {path.name} was written"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie has ended (only its parent's wait is missing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(predicate, within: float) -> bool:
    """True as soon as ``predicate()`` is; False once ``within`` seconds have passed without it."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def pids_in(path: Path) -> list[int]:
    """The pids a test's processes wrote to ``path`` (whitespace-separated), none while it does not exist."""
    return [int(p) for p in path.read_text().split()] if path.exists() else []
