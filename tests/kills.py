"""Killing a run with kill -9 at a chosen moment (the kill / resume tests)."""

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
