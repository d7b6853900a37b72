"""The contract of a metrics backend.

Lifecycle: :class:`~rlweave.runner.metrics.MetricsLogger` calls the backend module's
``open(ctx)`` once when it starts (a fresh run, a resume, or a recovery after a lost worker),
then :meth:`MetricsBackend.log` once per row in increasing step order, then
:meth:`MetricsBackend.close` exactly once (``failed=True`` when the run ends with an error).
``log`` gets the numeric values only (bools and non-finite values already left out).

A backend that needs to continue the same external run after a resume keeps its ids in
``ctx.state`` (saved by the logger as ``<run_dir>/loggers.json``); ``ctx.resumed`` says
whether earlier ids should be reused. Failures: ``open`` raises
:class:`~rlweave.loggers.LoggerUnavailable` when its package is missing; any other
error of ``open`` stops the run before its first step; errors of ``log`` propagate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class BackendContext:
    """What a backend gets when it opens.

    Attributes:
        run_dir: the run directory (backends write their local files under it).
        project: ``logging.project`` (W&B project, MLflow experiment).
        run_name: ``logging.run_name``, or ``run.name`` when unset.
        start_step: the step resumed from (None: a fresh start).
        settings: the whole ``logging`` section (backend-specific keys such as ``tracking_uri``).
        config: the run config (:class:`~rlweave.config.schema.RunConfig`), or None; a backend
            that records it dumps it itself (only then is every key of it read).
        state: this backend's entry of ``loggers.json`` (read and written by the logger).
    """

    run_dir: Path
    project: str
    run_name: str
    start_step: int | None = None
    settings: Any = None
    config: Any = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def resumed(self) -> bool:
        return self.start_step is not None


class MetricsBackend(ABC):
    """One destination of per-step metrics (see the module docstring)."""

    name: str = "backend"

    @abstractmethod
    def log(self, step: int, values: dict[str, float]) -> None:
        """Record ``values`` (numbers only) at ``step``."""

    @abstractmethod
    def close(self, failed: bool = False) -> None:
        """Flush and release everything; called once."""
