"""Which failures a run can recover from, and which roles they cost.

A run recovers (``run.max_restarts``) only from a *lost* worker: a rank whose process died
(:class:`~rlweave.worker_errors.WorkerError` with ``lost``, e.g. SIGKILL, OOM killer, a
segfault, or an engine whose engine process died) or a rank that hung past its call timeout
(:class:`~rlweave.worker_errors.WorkerTimeout`). An exception a worker method raised is a
bug or bad input: retrying would fail again, so it is never retried.

:func:`lost_roles` reads the exception, its causes and contexts (a weight-sync error wraps the
worker error), and the scheduler's liveness registry (another role may have died meanwhile).
"""

from __future__ import annotations

from typing import Iterator


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def lost_roles(exc: BaseException, roles: list[str] | None = None) -> dict[str, str]:
    """Role -> short reason for every role that lost a rank, from ``exc`` and (when Ray runs)
    the ranks Ray reports dead; empty when ``exc`` is not about a lost worker. ``roles``
    limits the answer to the run's roles."""
    from rlweave.worker_errors import WorkerError, WorkerTimeout

    found: dict[str, str] = {}
    for e in _chain(exc):
        if isinstance(e, WorkerTimeout):
            found.setdefault(e.role, f"rank(s) {', '.join(map(str, e.ranks))} hung in {e.method}()")
        elif isinstance(e, WorkerError) and e.lost:
            found.setdefault(e.role, f"rank {e.rank} lost: {e.summary}")
    if found:
        try:
            from rlweave.scheduler.ray_impl.liveness import LIVENESS

            for dead in LIVENESS.dead(force=True):
                found.setdefault(dead.role, f"rank {dead.rank} died: {dead.reason}")
        except Exception:  # noqa: BLE001 - no Ray: what the exception says is all there is
            pass
    if roles is not None:
        found = {r: why for r, why in found.items() if r in roles}
    return found
