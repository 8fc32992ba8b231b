"""The temporary model folder of a :class:`~openmanus_rl_core.engines.vllm.VLLMEngine` built from a model object,
and the clean-up of the folders that killed processes left behind.

vLLM starts from a folder: an engine built from a model object writes the model's config, generation config and
tokenizer to ``<tmp>/omrl-vllm-<pid>-<start>-*`` (``pid`` and start time of the owning process) and deletes it
once vLLM has started (also when the start fails). A process killed during start-up cannot delete it, so every
engine start removes the folders whose owner process is gone: no such pid, or a pid reused by a process started at
another time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["own_tmpdir", "remove_orphaned_tmpdirs"]

TMP_PREFIX = "omrl-vllm-"


def process_stamp(pid: int) -> int | None:
    """The start time of process ``pid`` in 1/100 s (None: no such process); with the pid it names one process."""
    import psutil

    try:
        return int(psutil.Process(pid).create_time() * 100)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def own_tmpdir() -> str:
    """A new temporary folder named after this process (pid and start time), so others can tell when it is dead."""
    pid = os.getpid()
    return tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{pid}-{process_stamp(pid)}-")


def remove_orphaned_tmpdirs(root: str | None = None) -> list[str]:
    """Delete the ``omrl-vllm-<pid>-<start>-*`` folders under ``root`` (default: the temp dir) whose owner is gone.

    A folder's owner is gone when no process has that pid or the pid now belongs to a process started at another
    time. Folders named otherwise are left alone. Returns the paths removed.
    """
    base = Path(root or tempfile.gettempdir())
    removed = []
    for path in base.glob(f"{TMP_PREFIX}*"):
        parts = path.name[len(TMP_PREFIX):].split("-")
        if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()) or not path.is_dir():
            continue
        if process_stamp(int(parts[0])) != int(parts[1]):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed
