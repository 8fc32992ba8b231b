"""Files written whole: a reader, or a run resumed after a kill, sees the old file or the new one, never half of one.

:func:`write_atomic` writes into a hidden temporary file beside the target (``.<name>.<pid>-<random>.tmp``; a file
that a killed writer leaves behind matches no reader's pattern) and renames it over the target, which is atomic on
one filesystem. Checkpoints, a folder of files, have their own protocol (:mod:`openmanus_rl_core.checkpoint.store`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable, Union

__all__ = ["write_atomic"]

Content = Union[bytes, str, Callable[[BinaryIO], None]]
"""What :func:`write_atomic` writes: bytes, text (as UTF-8), or a function that writes to the open binary file."""


def write_atomic(path: str | os.PathLike, content: Content, durable: bool = False) -> Path:
    """Write ``content`` to ``path`` whole (module doc); returns ``path``. ``durable``: the file's data reaches the
    disk (fsync) before the rename, so not even a power loss exposes a renamed file without its data. On a failure
    the temporary file is removed and the error raised; ``path`` is as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
