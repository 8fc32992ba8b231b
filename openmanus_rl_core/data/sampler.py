"""The task sampler: deterministic, resumable batches of task rows, epoch after epoch."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from openmanus_rl_core.data.tasks import DataError

__all__ = ["TaskSampler"]


class TaskSampler:
    """Deterministic batches of tasks, epoch after epoch.

    Epoch ``e`` visits the tasks in the order ``numpy.random.default_rng([seed, e]).permutation(n)``
    (or in file order when ``shuffle=False``). A batch that runs past the end of an epoch is filled
    from the start of the next one, so every batch has exactly ``batch_size`` tasks even when
    ``batch_size`` does not divide (or exceeds) the number of tasks. The order depends on nothing but
    ``seed``, so ``load_state_dict(state_dict())`` continues with exactly the batches the
    uninterrupted sampler would have produced. Batches are shallow copies of the task dicts.
    """

    def __init__(self, tasks: Sequence[dict], batch_size: int, seed: int = 0, shuffle: bool = True):
        if len(tasks) == 0:
            raise DataError("TaskSampler got no tasks; check data.train_files / data.val_files")
        if int(batch_size) < 1:
            raise DataError(f"batch_size={batch_size!r} must be >= 1")
        self.tasks = list(tasks)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.position = 0  # index into the current epoch's order of the next task to hand out
        self._order_epoch: int | None = None
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        """Batches per epoch (rounded up)."""
        return -(-len(self.tasks) // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The task indices of ``epoch``, in visiting order."""
        if self._order_epoch != epoch:
            n = len(self.tasks)
            self._order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order  # type: ignore[return-value]

    def next_batch(self, size: int | None = None) -> list[dict]:
        """The next ``size`` rows (the batch size when None), across epochs."""
        size = self.batch_size if size is None else int(size)
        batch: list[dict] = []
        while len(batch) < size:
            order = self.order(self.epoch)
            take = min(size - len(batch), len(order) - self.position)
            batch.extend(dict(self.tasks[i]) for i in order[self.position:self.position + take])
            self.position += take
            if self.position >= len(order):
                self.epoch += 1
                self.position = 0
        return batch

    def __iter__(self) -> Iterator[list[dict]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        """Plain ints and bools (safe for ``torch.load(weights_only=True)`` and JSON)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; the task list, seed and shuffle flag must be the ones it was saved with."""
        if int(state["num_tasks"]) != len(self.tasks):
            raise DataError(f"sampler state was saved with {state['num_tasks']} tasks but this run has "
                            f"{len(self.tasks)}; resume with the same task files (data.train_files) as the saved run")
        for key, mine in (("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and type(mine)(state[key]) != mine:
                raise DataError(f"sampler state was saved with {key}={state[key]!r} but this run has {key}={mine!r}; "
                                f"resume with the same data settings, or start a fresh run directory")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < len(self.tasks):
            raise DataError(f"sampler state epoch={epoch}, position={position} is out of range for {len(self.tasks)} tasks")
        self.epoch, self.position = epoch, position
