"""Test-only fault injection: an actor worker that poisons one step's update with NaN or dies once during it, and a
trainer that runs with it. The production code reads no debug switch; tests swap these classes in.

As a script it is ``openmanus-rl train`` with the faulty actor::

    python tests/fault_injection.py --crash-step 3 env=key_door trainer.run_dir=/tmp/run ...
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from openmanus_rl_core.run.trainer import Trainer
from openmanus_rl_core.workers import ActorWorker

CRASH_MARKER = ".crash_done"
"""Written into the run directory just before the crash: the restarted worker then gets through that step."""


def faulty_actor(nan_step: int | None = None, crash_step: int | None = None, run_dir: str | None = None) -> type:
    """An :class:`ActorWorker` whose ``update`` at ``nan_step`` gets NaN advantages (a non-finite loss on every
    rank) and whose last rank exits at ``crash_step``, once per ``run_dir``, as a real crash would.

    Defined in a function, so Ray ships the class by value to worker processes that cannot import this module.
    """

    class FaultyActorWorker(ActorWorker):
        def update(self, batch, step):
            if step == crash_step and self.rank == self.world_size - 1:
                marker = Path(str(run_dir)) / CRASH_MARKER
                if not marker.exists():
                    marker.touch()
                    os._exit(1)
            if step == nan_step:
                batch["advantages"] = batch["advantages"] * float("nan")
            return super().update(batch, step)

    return FaultyActorWorker


def faulty_trainer(**faults: Any) -> type[Trainer]:
    """A :class:`Trainer` whose actor group runs :func:`faulty_actor` ``(**faults)``."""
    actor = faulty_actor(**faults)

    class FaultyTrainer(Trainer):
        def worker_classes(self):
            return actor, super().worker_classes()[1]

    return FaultyTrainer


def fit(trainer_cls: type[Trainer], cfg: Any) -> dict[str, float]:
    """Set up, fit and shut down one run of ``trainer_cls``, as ``openmanus-rl train`` does; the final metrics."""
    trainer = trainer_cls(cfg)
    try:
        trainer.setup()
        return trainer.fit()
    finally:
        trainer.shutdown()


def main(argv: list[str] | None = None) -> int:
    from openmanus_rl_core.config.loading import compose

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nan-step", type=int)
    parser.add_argument("--crash-step", type=int)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    cfg = compose(args.overrides)
    fit(faulty_trainer(nan_step=args.nan_step, crash_step=args.crash_step,
                       run_dir=str(cfg.trainer.run_dir)), cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
