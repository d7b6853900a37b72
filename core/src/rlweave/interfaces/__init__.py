"""Abstract contracts of workers, engines and algorithms (light: no torch at import)."""

from rlweave.interfaces.worker import Worker, WorkerContext

__all__ = ["Worker", "WorkerContext"]
