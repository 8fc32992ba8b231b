"""The columns a task file may hold, with the type each is read and written as, and the error a bad file raises."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["DataError", "COLUMNS"]


class DataError(ValueError):
    """A task file that cannot be used: names the file, the column, the expected type and the row."""


# column -> (expected type as the error message names it, arrow type written by write_tasks)
COLUMNS: dict[str, tuple[str, pa.DataType]] = {
    "env": ("string", pa.string()),
    "task_id": ("int64", pa.int64()),
    "seed": ("int64", pa.int64()),
    "split": ("string", pa.string()),
    "prompt": ("string", pa.string()),
    "ground_truth": ("string", pa.string()),
    "data_source": ("string", pa.string()),
    "source": ("string", pa.string()),
    "extra": ("string (JSON)", pa.string()),
}
