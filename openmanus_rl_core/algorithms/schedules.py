"""Learning-rate schedules and the optimizer they drive."""

from __future__ import annotations

import math

import torch

from openmanus_rl_core.config.schema import OptimConfig


def make_lr_lambda(schedule: str, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0):
    """The LR multiplier per scheduler step ``s`` (one scheduler step per training step).

    - warm-up (``s < warmup_steps``): ``(s + 1) / warmup_steps``
    - ``constant``: 1
    - ``cosine``: ``min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * p))``,
      ``p = (s - warmup_steps) / max(1, total_steps - warmup_steps)`` clamped to [0, 1]
    - ``linear``: ``min_lr_ratio + (1 - min_lr_ratio) * (1 - p)``
    """
    schedules = {
        "constant": lambda p: 1.0,
        "cosine": lambda p: min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)),
        "linear": lambda p: min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - p),
    }
    if schedule not in schedules:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {sorted(schedules)}")
    shape = schedules[schedule]
    warmup_steps = max(0, int(warmup_steps))
    total_steps = max(1, int(total_steps))

    def lr_lambda(s: int) -> float:
        if s < warmup_steps:
            return float(s + 1) / float(warmup_steps)
        p = min(1.0, max(0.0, (s - warmup_steps) / max(1, total_steps - warmup_steps)))
        return float(shape(p))

    return lr_lambda

def make_optimizer(params, ocfg: OptimConfig, total_steps: int):
    optimizer = torch.optim.AdamW(params, lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                                  weight_decay=ocfg.weight_decay)
    lr_lambda = make_lr_lambda(ocfg.lr_schedule, total_steps, ocfg.lr_warmup_steps, ocfg.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    return optimizer, scheduler

