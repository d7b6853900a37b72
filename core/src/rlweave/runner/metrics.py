"""Per-step metrics: one JSON line per :meth:`MetricsLogger.log` in ``<run_dir>/metrics.jsonl``,
and the numeric values to the backends ``logging.backends`` selects (TensorBoard under
``<run_dir>/tensorboard`` by default; Weights & Biases, MLflow: :mod:`rlweave.loggers`).

Contract: each line is ``{"step": int, "time": unix seconds, **metrics}``; values that are
tensors/numpy scalars become floats; non-finite floats are written as ``null``; values that
are neither numbers nor JSON-able become strings. Backends get the finite numbers of the row
(no bools, strings or nulls). The jsonl is always written. TensorBoard is optional: when
neither ``torch.utils.tensorboard`` nor ``tensorboardX`` imports, a warning is logged once and
it is skipped; a selected W&B or MLflow whose package is missing raises
:class:`~rlweave.loggers.LoggerUnavailable` (``rlweave validate`` reports it earlier).
``start_step`` (resume) drops rows after that step from an existing file, so a resumed run
does not leave duplicate steps, and continues the same W&B / MLflow run (their ids are kept
in ``<run_dir>/loggers.json``).
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


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _open_backends(run_dir: Path, names: list[str], start_step: int | None, config: Any) -> list[Any]:
    """Open each selected backend (jsonl excluded); ``loggers.json`` keeps their run ids."""
    import importlib

    from rlweave.loggers import BACKENDS
    from rlweave.loggers.base import BackendContext

    settings = getattr(config, "logging", None)
    run_name = (getattr(settings, "run_name", None) or getattr(getattr(config, "run", None), "name", None)
                or run_dir.name)
    state_path = run_dir / LOGGERS_STATE
    try:
        states = json.loads(state_path.read_text(encoding="utf-8")) if state_path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        states = {}
    opened = []
    try:
        for name in names:
            module = BACKENDS[name].module
            if module is None:
                continue
            ctx = BackendContext(run_dir=run_dir, project=getattr(settings, "project", "rlweave"), run_name=run_name,
                                 start_step=start_step, settings=settings, config=config,
                                 state=dict(states.get(name) or {}))
            backend = importlib.import_module(module).open(ctx)
            if backend is not None:
                opened.append(backend)
                if ctx.state:
                    states[name] = ctx.state
    except BaseException:
        for backend in opened:
            backend.close(failed=True)
        raise
    if states:
        tmp = state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(states, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, state_path)
    return opened


#: the backends' run ids (W&B, MLflow), so that a resumed run continues the same external run
LOGGERS_STATE = "loggers.json"


class MetricsLogger:
    """Append-only metrics of one run (see module docstring).

    Args:
        run_dir: the run directory.
        tensorboard: also write TensorBoard event files (when the package is there); used
            only when ``config`` is None.
        start_step: on resume, the step of the checkpoint resumed from.
        config: the run config (:class:`~rlweave.config.schema.RunConfig`): its ``logging``
            section selects the backends; ``run.name`` is the default external run name.
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, start_step: int | None = None,
                 config: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if config is not None and getattr(config, "logging", None) is not None:
            names = [n for n in config.logging.backends if n != "jsonl"]
        else:
            names = ["tensorboard"] if tensorboard else []
        self.backends = _open_backends(self.run_dir, names, start_step, config)
        if start_step is not None and self.path.exists():
            keep = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= start_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
            os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write one row for ``step``; returns the row as written."""
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({str(k): _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        values = _numbers(row)
        for backend in self.backends:
            backend.log(int(step), values)
        return row

    def close(self, failed: bool = False) -> None:
        """Close the file and every backend (once; ``failed``: the run ended with an error)."""
        if not self._file.closed:
            self._file.close()
        backends, self.backends = self.backends, []
        errors = []
        for backend in backends:
            try:
                backend.close(failed=failed)
            except Exception as exc:  # noqa: BLE001 - close the others first
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)
