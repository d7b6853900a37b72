"""Learning-rate schedule: linear warm-up, then constant or cosine to a floor
(:class:`WarmupSchedule`), and how a checkpoint stores and restores it
(:func:`schedule_state`, :func:`restore_schedule`: the one way every backend resumes its
schedule). No torch import: the functions take the ``LambdaLR`` they are given."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class WarmupSchedule:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based; LambdaLR contract).

    Warm-up: ``(step + 1) / warmup_steps`` for the first ``warmup_steps`` steps; then 1.0
    (``constant``) or a half cosine from 1.0 to ``min_lr_ratio`` reached at ``total_steps``."""

    warmup_steps: int = 0
    schedule: str = "constant"
    total_steps: int | None = None
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"optim.schedule: unknown schedule {self.schedule!r} (constant, cosine)")
        if self.schedule == "cosine" and not self.total_steps:
            raise ValueError("optim.total_steps is required for the cosine schedule")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        span = max(1, int(self.total_steps) - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def schedule_state(scheduler: Any) -> dict[str, Any] | None:
    """What a checkpoint stores of ``scheduler`` (a ``LambdaLR``; None: the role has no
    optimizer): its ``state_dict()``, JSON values (the multiplier functions are not saved)."""
    return scheduler.state_dict() if scheduler is not None else None


def restore_schedule(scheduler: Any, state: dict[str, Any] | None) -> None:
    """Restore ``scheduler`` (a ``LambdaLR``; None: nothing to restore) from ``state``, what
    :func:`schedule_state` returned (None: nothing was saved), and set each parameter group's
    learning rate to the schedule's last one: a checkpoint that does not hold the optimizer's
    param groups would otherwise leave them at the first step's, and one that does holds the
    same value."""
    if scheduler is None or state is None:
        return
    scheduler.load_state_dict(state)
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
