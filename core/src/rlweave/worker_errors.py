"""Errors of calls on a role's workers (pure Python, picklable; imports nothing).

A role handle (:mod:`rlweave.scheduler`) raises :class:`WorkerError` and :class:`WorkerTimeout`
on the controller; a worker raises :class:`WorkerLost` when its own machinery is gone; the Ray
actor wrapper carries a worker-side exception back as :class:`RemoteFailure`. The weight sync
and the runner catch them. They live below all of those, so each can import them.
"""

from __future__ import annotations


class RemoteFailure(Exception):
    """Carrier of a worker-side exception back to the controller.

    Raised inside the worker process (by the Ray actor wrapper) so that what crosses the
    process boundary is always picklable: the original exception travels as ``exc`` when
    it pickles, and always as its type name, message and formatted traceback.
    """

    def __init__(self, role: str, rank: int, method: str, exc_type: str, message: str, traceback: str, exc=None,
                 lost: bool = False):
        super().__init__(role, rank, method, exc_type, message, traceback, exc, lost)
        self.role, self.rank, self.method = role, rank, method
        self.exc_type, self.message, self.traceback, self.exc = exc_type, message, traceback, exc
        self.lost = lost  #: the exception was a WorkerLost: the rank must be rebuilt

    def __str__(self) -> str:
        return f"{self.role} rank {self.rank}: {self.method}() raised {self.exc_type}: {self.message}"


class WorkerLost(RuntimeError):
    """Raised by a worker whose own machinery is gone although its process lives (e.g. an
    inference engine's engine process died): the rank cannot serve calls any more and must be
    rebuilt, like a rank whose process died (see ``WorkerError.lost``)."""


class WorkerError(RuntimeError):
    """A rank of a role failed: its method raised, or its process died.

    Attributes: ``role``, ``rank``, ``method``, ``remote_traceback`` (the worker-side
    traceback, or the reason the actor died), ``cause`` (the original exception object when
    it could be carried back, else None), ``lost``: True when the rank cannot serve calls any
    more (its process died, or it raised :class:`WorkerLost`), so only rebuilding it helps;
    False for an ordinary exception raised by the method. ``log_file``: the file holding the
    rank's own output (``<run_dir>/logs/<role>-<rank>.log``), when it has one.
    """

    def __init__(self, role: str, rank: int, method: str, summary: str, remote_traceback: str = "", cause=None,
                 lost: bool = False, log_file: str | None = None):
        self.role, self.rank, self.method = role, rank, method
        self.summary, self.remote_traceback, self.cause, self.lost = summary, remote_traceback, cause, lost
        self.log_file = log_file
        text = f"role {role!r} rank {rank}: {method}() failed: {summary}"
        if log_file:
            text += f" (the rank's output: {log_file})"
        if remote_traceback:
            text += f"\n--- remote traceback ({role} rank {rank}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.role, self.rank, self.method, self.summary, self.remote_traceback, None, self.lost,
                             self.log_file))

    def with_log(self, log_file: str | None) -> "WorkerError":
        """This error naming ``log_file`` (None, or one named already: itself)."""
        if not log_file or self.log_file:
            return self
        return type(self)(self.role, self.rank, self.method, self.summary, self.remote_traceback, self.cause,
                          self.lost, log_file)


class WorkerTimeout(TimeoutError):
    """A call on a role did not finish within its timeout; names the ranks still running and,
    when the timeout came from the config, the setting (``roles.<role>.timeouts.<key>``).
    ``stacks``: rank -> where that rank was when the time ran out (the innermost frames of the
    thread running the call, or a sentence saying why they could not be read), for the ranks
    the scheduler could look at; the message shows them."""

    def __init__(self, role: str, method: str, ranks: list[int], timeout_s: float, setting: str | None = None,
                 stacks: dict[int, str] | None = None):
        self.role, self.method, self.ranks, self.timeout_s = role, method, list(ranks), timeout_s
        self.setting, self.stacks = setting, dict(stacks or {})
        text = f"role {role!r}: {method}() did not finish within {timeout_s:g} s on rank(s) {', '.join(map(str, ranks))}"
        if setting:
            text += f" (the worker may be hung; the limit is {setting})"
        for rank, stack in sorted(self.stacks.items()):
            text += f"\n--- where {role} rank {rank} was (most recent call first) ---\n{stack.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.role, self.method, self.ranks, self.timeout_s, self.setting, self.stacks))
