"""TensorBoard event files under ``<run_dir>/tensorboard``.

Uses ``torch.utils.tensorboard`` (or ``tensorboardX``); when neither imports, ``open`` warns
once and returns None (the run goes on with its other backends). On resume, events after the
resumed step are purged so no step appears twice.
"""

from __future__ import annotations

import logging
from typing import Any

from rlweave.loggers.base import BackendContext, MetricsBackend

log = logging.getLogger("rlweave.metrics")


class TensorBoardBackend(MetricsBackend):
    name = "tensorboard"

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=int(step))
        self._writer.flush()

    def close(self, failed: bool = False) -> None:
        self._writer.close()


def open(ctx: BackendContext) -> TensorBoardBackend | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # noqa: BLE001 - torch without tensorboard, or no torch at all
        try:
            from tensorboardX import SummaryWriter  # type: ignore[no-redef]
        except Exception:  # noqa: BLE001
            log.warning("TensorBoard not available (pip install tensorboard); writing metrics.jsonl only")
            return None
    purge = ctx.start_step + 1 if ctx.start_step is not None else None
    return TensorBoardBackend(SummaryWriter(log_dir=str(ctx.run_dir / "tensorboard"), purge_step=purge))
