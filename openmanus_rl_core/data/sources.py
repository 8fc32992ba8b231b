"""Draws by source: the sampler of a run whose tasks come from several sources (``env=mix``) at set ratios."""

from __future__ import annotations

import zlib
from typing import Mapping, Sequence

from openmanus_rl_core.data.sampler import TaskSampler
from openmanus_rl_core.data.tasks import DataError

__all__ = ["SourceSampler", "make_sampler", "first_tasks"]


class SourceSampler:
    """Batches whose rows come from each source in proportion to its ratio, each source in its own order.

    Every source has its own :class:`TaskSampler` (shuffled epoch after epoch by ``[seed, source]``). A draw of
    ``k`` rows gives each source its share of all rows drawn so far plus ``k`` (largest remainder, ties to the
    source listed first), minus what it already had: at 3:1 a batch of 4 is 3 + 1 every step, a batch of 2 is
    2 + 0, 1 + 1, 2 + 0, ... and no source drifts from its ratio by a row or more. The state is each source's
    sampler state and its count of rows drawn, so a resumed run draws what the uninterrupted one would have.
    """

    def __init__(self, tasks: Sequence[dict], batch_size: int, ratios: Mapping[str, float], seed: int = 0,
                 shuffle: bool = True):
        self.batch_size = int(batch_size)
        self.ratios = {str(k): float(v) for k, v in ratios.items()}
        by_source: dict[str, list[dict]] = {name: [] for name in self.ratios}
        for task in tasks:
            source = task.get("source")
            if source not in by_source:
                raise DataError(f"a task row has source={source!r}, not one of the sources "
                                f"{', '.join(self.ratios)}; write the task files with the same env=mix sources")
            by_source[source].append(task)
        empty = [name for name, rows in by_source.items() if not rows]
        if empty:
            raise DataError(f"no training task has source={empty[0]!r}; every source needs tasks "
                            f"(env.kwargs.sources.{empty[0]}.train_tasks, or the task files)")
        self.samplers = {name: TaskSampler(rows, batch_size, seed=_source_seed(seed, name), shuffle=shuffle)
                         for name, rows in by_source.items()}
        self.drawn = {name: 0 for name in self.ratios}
        self.tasks = list(tasks)

    def __len__(self) -> int:
        return -(-len(self.tasks) // self.batch_size)

    def shares(self, size: int) -> dict[str, int]:
        """How many of the next ``size`` rows each source gives."""
        total = sum(self.drawn.values()) + int(size)
        weight = sum(self.ratios.values())
        exact = {name: total * r / weight for name, r in self.ratios.items()}
        target = {name: int(x) for name, x in exact.items()}
        order = sorted(self.ratios, key=lambda name: -(exact[name] - target[name]))  # stable: listed order on ties
        for name in order[: total - sum(target.values())]:
            target[name] += 1
        # A source already ahead of its share (a ratio met early) gives nothing; the others make up the size.
        give = {name: max(0, target[name] - self.drawn[name]) for name in self.ratios}
        while sum(give.values()) > size:
            name = max(give, key=lambda n: (self.drawn[n] + give[n]) / self.ratios[n])
            give[name] -= 1
        return give

    def next_batch(self, size: int | None = None) -> list[dict]:
        size = self.batch_size if size is None else int(size)
        batch: list[dict] = []
        for name, k in self.shares(size).items():
            if k:
                batch.extend(self.samplers[name].next_batch(k))
                self.drawn[name] += k
        return batch

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"sources": {name: s.state_dict() for name, s in self.samplers.items()}, "drawn": dict(self.drawn)}

    def load_state_dict(self, state: dict) -> None:
        if set(state.get("sources", {})) != set(self.samplers):
            raise DataError(f"sampler state was saved with the sources {', '.join(state.get('sources', {})) or '(none)'} "
                            f"but this run has {', '.join(self.samplers)}; resume with the same env.kwargs.sources")
        for name, s in self.samplers.items():
            s.load_state_dict(state["sources"][name])
        self.drawn = {name: int(state["drawn"][name]) for name in self.samplers}


def _source_seed(seed: int, name: str) -> int:
    """A source's shuffle seed: the data seed and the source's name (not its position in the list)."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 31)


def make_sampler(tasks: Sequence[dict], batch_size: int, seed: int, shuffle: bool,
                 ratios: Mapping[str, float] | None = None) -> TaskSampler | SourceSampler:
    """The run's sampler: by source when the env names sources with ratios, else one order over all tasks."""
    if ratios:
        return SourceSampler(tasks, batch_size, ratios, seed=seed, shuffle=shuffle)
    return TaskSampler(tasks, batch_size, seed=seed, shuffle=shuffle)


def first_tasks(tasks: Sequence[dict], limit: int, ratios: Mapping[str, float] | None = None) -> list[dict]:
    """The first ``limit`` of ``tasks`` (``trainer.val_max_tasks`` of the validation tasks). With ``ratios`` (a mix's
    sources), each source's first rows, ``limit`` spread over the sources by ratio (largest remainder, ties to the
    source listed first; a source short of rows leaves its place to the others), so every source is validated;
    the rows keep their order in ``tasks``."""
    if not ratios:
        return list(tasks[:limit])
    rows: dict[str, list[int]] = {str(name): [] for name in ratios}
    for i, task in enumerate(tasks):
        rows.setdefault(str(task.get("source")), []).append(i)
    weight = sum(float(r) for r in ratios.values())
    exact = {str(n): limit * float(r) / weight for n, r in ratios.items()}
    take = {n: int(x) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: -(exact[n] - take[n]))[: max(0, limit - sum(take.values()))]:
        take[n] += 1
    take = {n: min(k, len(rows[n])) for n, k in take.items()}
    while sum(take.values()) < min(limit, sum(len(rows[n]) for n in take)):  # shares a short source left
        for n in take:
            if take[n] < len(rows[n]) and sum(take.values()) < limit:
                take[n] += 1
    keep = sorted(i for n, k in take.items() for i in rows[n][:k])
    return [tasks[i] for i in keep]
