"""A small arithmetic set ("What is 17 + 25?" -> "42"): the dataset env's built-in data, and a parquet writer
for it in the common (verl) layout.

Row ``i`` of ``arithmetic_rows(n, seed)`` depends on ``(seed, i)`` only, so a longer set starts with the rows of a
shorter one and every process builds the same rows. Operations, drawn uniformly:

- ``a + b`` with ``a, b`` in 0..50;
- ``a - b`` with ``a`` in 0..50, ``b`` in 0..a (never negative);
- ``a * b`` with ``a, b`` in 2..12.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from openmanus_rl_core.atomic import write_atomic

__all__ = ["arithmetic_rows", "make_arithmetic", "DATA_SOURCE"]

DATA_SOURCE = "arithmetic"


def _question(seed: int, index: int) -> tuple[str, int]:
    rng = random.Random(f"openmanus-rl-arithmetic/{int(seed)}/{int(index)}")
    op = rng.choice("+-*")
    if op == "+":
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        return f"What is {a} + {b}?", a + b
    if op == "-":
        a = rng.randint(0, 50)
        b = rng.randint(0, a)
        return f"What is {a} - {b}?", a - b
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"What is {a} * {b}?", a * b


def arithmetic_rows(n: int = 400, seed: int = 0, val_fraction: float = 0.2) -> list[dict[str, Any]]:
    """``n`` rows in the verl layout::

        {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "What is 17 + 25?"}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": "42"},
         "extra_info": {"index": i, "split": "train" | "val"}}

    The last ``round(n * val_fraction)`` rows are marked ``split: val`` (the dataset env's config trains on the
    first rows and validates on the following ones, matching this).
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"arithmetic set size n={n!r} must be >= 1")
    if not 0.0 <= float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction={val_fraction!r} must be in [0, 1)")
    n_val = int(round(n * float(val_fraction)))
    rows = []
    for i in range(n):
        question, answer = _question(seed, i)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"index": i, "split": "val" if i >= n - n_val else "train"},
        })
    return rows


def make_arithmetic(path: str | os.PathLike, n: int = 400, seed: int = 0, val_fraction: float = 0.2) -> Path:
    """Write :func:`arithmetic_rows` to ``path`` as parquet (verl layout: ``prompt`` a chat list,
    ``reward_model`` a struct with ``ground_truth``), atomically. Point ``env.kwargs.path`` at it.
    Returns the path.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(os.fspath(path)).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(arithmetic_rows(n, seed, val_fraction))
    return write_atomic(path, lambda f: pq.write_table(table, f))
