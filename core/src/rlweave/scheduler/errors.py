"""Errors a role handle raises on the controller (pure Python, picklable)."""

from __future__ import annotations


class RemoteFailure(Exception):
    """Carrier of a worker-side exception back to the controller.

    Raised inside the worker process (by the Ray actor wrapper) so that what crosses the
    process boundary is always picklable: the original exception travels as ``exc`` when
    it pickles, and always as its type name, message and formatted traceback.
    """

    def __init__(self, role: str, rank: int, method: str, exc_type: str, message: str, traceback: str, exc=None):
        super().__init__(role, rank, method, exc_type, message, traceback, exc)
        self.role, self.rank, self.method = role, rank, method
        self.exc_type, self.message, self.traceback, self.exc = exc_type, message, traceback, exc

    def __str__(self) -> str:
        return f"{self.role} rank {self.rank}: {self.method}() raised {self.exc_type}: {self.message}"


class WorkerError(RuntimeError):
    """A rank of a role failed: its method raised, or its process died.

    Attributes: ``role``, ``rank``, ``method``, ``remote_traceback`` (the worker-side
    traceback, or the reason the actor died), ``cause`` (the original exception object when
    it could be carried back, else None).
    """

    def __init__(self, role: str, rank: int, method: str, summary: str, remote_traceback: str = "", cause=None):
        self.role, self.rank, self.method = role, rank, method
        self.summary, self.remote_traceback, self.cause = summary, remote_traceback, cause
        text = f"role {role!r} rank {rank}: {method}() failed: {summary}"
        if remote_traceback:
            text += f"\n--- remote traceback ({role} rank {rank}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.role, self.rank, self.method, self.summary, self.remote_traceback, None))


class WorkerTimeout(TimeoutError):
    """A call on a role did not finish within the caller's timeout; names the ranks still running."""

    def __init__(self, role: str, method: str, ranks: list[int], timeout_s: float):
        self.role, self.method, self.ranks, self.timeout_s = role, method, list(ranks), timeout_s
        super().__init__(
            f"role {role!r}: {method}() did not finish within {timeout_s:g} s on rank(s) {', '.join(map(str, ranks))}"
        )

    def __reduce__(self):
        return (type(self), (self.role, self.method, self.ranks, self.timeout_s))
