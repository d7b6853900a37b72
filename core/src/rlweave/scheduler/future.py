"""RoleFuture: the result of a call on a role, available later."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from rlweave.scheduler.group import WorkerGroup, look_until
from rlweave.worker_errors import WorkerTimeout

_UNSET = object()


class RoleFuture:
    """A call running on some ranks of a role.

    ``result(timeout=None)`` blocks until every called rank finished and returns the
    combined result (what the handle method documents). A failing rank raises
    :class:`~rlweave.worker_errors.WorkerError` naming role, rank and the remote
    traceback. ``timeout`` (seconds; ``None``: the call's own limit, ``default_timeout``, which
    a handle sets from ``roles.<role>.timeouts``) raises
    :class:`~rlweave.worker_errors.WorkerTimeout` naming the ranks still running and the
    setting, and leaves the call running (call ``result`` again to keep waiting). A future
    with neither waits for ever. ``done()`` never blocks. Results are computed once and cached.
    """

    def __init__(self, group: WorkerGroup, pending: list[Any], combine: Callable[[list[Any]], Any],
                 default_timeout: float | None = None, setting: str | None = None):
        self._group, self._pending, self._combine = group, pending, combine
        self.default_timeout, self.setting = default_timeout, setting
        self._value: Any = _UNSET
        self.dispatch_s = self.wait_s = self.combine_s = 0.0

    def done(self) -> bool:
        return self._value is not _UNSET or self._group.done(self._pending)

    def result(self, timeout: float | None = None) -> Any:
        if self._value is _UNSET:
            limit = self.default_timeout if timeout is None else timeout
            t0 = time.perf_counter()
            try:
                values = self._group.wait(self._pending, limit)
            except WorkerTimeout as exc:
                if timeout is not None or exc.setting or not self.setting:
                    raise
                raise WorkerTimeout(exc.role, exc.method, exc.ranks, exc.timeout_s, self.setting, exc.stacks) from None
            finally:
                self.wait_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            self._value = self._combine(values)
            self.combine_s = time.perf_counter() - t0
        return self._value

    @staticmethod
    def ready(value: Any) -> "RoleFuture":
        """A future already holding ``value`` (e.g. a call with nothing to do)."""
        fut = RoleFuture.__new__(RoleFuture)
        fut._group, fut._pending, fut._combine, fut._value = None, [], None, value
        fut.default_timeout, fut.setting = None, None
        fut.dispatch_s = fut.wait_s = fut.combine_s = 0.0
        return fut

    def __repr__(self) -> str:
        return f"RoleFuture(done={self.done()})"


def wait_any(futures: Sequence[RoleFuture], timeout: float) -> None:
    """Return once one of ``futures`` is done, or after ``timeout`` seconds; raises nothing
    (``result()`` tells how a call ended). Calls of groups of one class are waited on by that
    class (:meth:`~rlweave.scheduler.group.WorkerGroup.wait_any`: on Ray, one ``ray.wait``
    without polling); calls of several classes, and futures that are not :class:`RoleFuture`
    (anything with ``done()``), are looked at every :data:`~rlweave.scheduler.group.LOOK_S`
    seconds."""
    if not all(isinstance(f, RoleFuture) for f in futures):  # other futures (tests' doubles): look in turn
        if futures:
            look_until(lambda: any(f.done() for f in futures), timeout)
        return
    calls = []
    for f in futures:
        if f._value is not _UNSET or f._group is None:
            return
        calls.append((f._group, f._pending))
    if not calls:
        return
    kinds = {type(group) for group, _ in calls}
    (kinds.pop() if len(kinds) == 1 else WorkerGroup).wait_any(calls, timeout)
