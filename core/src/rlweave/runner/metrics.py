"""Per-step metrics: one JSON line per :meth:`MetricsLogger.log` in ``<run_dir>/metrics.jsonl``,
and the numeric values as TensorBoard scalars under ``<run_dir>/tensorboard``.

Contract: each line is ``{"step": int, "time": unix seconds, **metrics}``; values that are
tensors/numpy scalars become floats; non-finite floats are written as ``null``; values that
are neither numbers nor JSON-able become strings. TensorBoard is optional: when neither
``torch.utils.tensorboard`` nor ``tensorboardX`` imports, a warning is logged once and only the
jsonl is written. ``start_step`` (resume) drops rows after that step from an existing file, so a
resumed run does not leave duplicate steps.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("rlweave.metrics")


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a torn last line, from a crash, is skipped)."""
    rows = []
    p = Path(path)
    if not p.is_file():
        return rows
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _open_writer(log_dir: Path, purge_step: int | None) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # noqa: BLE001 - torch without tensorboard, or no torch at all
        try:
            from tensorboardX import SummaryWriter  # type: ignore[no-redef]
        except Exception:  # noqa: BLE001
            log.warning("TensorBoard not available (pip install tensorboard); writing metrics.jsonl only")
            return None
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


class MetricsLogger:
    """Append-only metrics of one run (see module docstring).

    Args:
        run_dir: the run directory.
        tensorboard: also write TensorBoard event files (when the package is there).
        start_step: on resume, the step of the checkpoint resumed from.
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, start_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if start_step is not None and self.path.exists():
            keep = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= start_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
            os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            purge = start_step + 1 if start_step is not None else None
            self._tb = _open_writer(self.run_dir / "tensorboard", purge)

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write one row for ``step``; returns the row as written."""
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({str(k): _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, global_step=int(step))
            self._tb.flush()
        return row

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
