"""openmanus_rl_core.atomic: a file is replaced whole or not at all."""

from __future__ import annotations

import pytest

from openmanus_rl_core.atomic import write_atomic


def test_bytes_text_and_a_writer_each_replace_the_file_and_leave_no_temporary_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert write_atomic(path, b"\x00\x01") == path and path.read_bytes() == b"\x00\x01"
    write_atomic(path, "caf\u00e9\n")
    assert path.read_bytes() == "caf\u00e9\n".encode("utf-8")
    write_atomic(path, lambda f: f.write(b"written by the writer"), durable=True)
    assert path.read_bytes() == b"written by the writer"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_a_writer_that_fails_midway_leaves_the_old_file_as_it_was(tmp_path):
    path = tmp_path / "tasks.parquet"
    path.write_bytes(b"the old file")

    def half(f):
        f.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half)
    assert path.read_bytes() == b"the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.parquet"]
