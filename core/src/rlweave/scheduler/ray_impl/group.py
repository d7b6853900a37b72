"""RayWorkerGroup: one Ray actor per rank (see :class:`rlweave.scheduler.group.WorkerGroup`)."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from rlweave.scheduler import stacks
from rlweave.scheduler.group import RankArgs, WorkerGroup
from rlweave.scheduler.trace import TRACE, Timed
from rlweave.scheduler.ray_impl.actor import CONTROL_GROUP, GENERATE_GROUP
from rlweave.scheduler.ray_impl.liveness import LIVENESS, DeadRank
from rlweave.worker_errors import RemoteFailure, WorkerError, WorkerTimeout


def to_worker_error(exc: BaseException, role: str, rank: int, method: str) -> WorkerError:
    """Turn what ``ray.get`` raised for one rank into a :class:`WorkerError`."""
    import ray.exceptions as rex

    cause = getattr(exc, "cause", None) if isinstance(exc, rex.RayTaskError) else exc
    if isinstance(cause, RemoteFailure):
        return WorkerError(role, rank, cause.method, f"{cause.exc_type}: {cause.message}", cause.traceback, cause.exc,
                           lost=cause.lost)
    if isinstance(exc, rex.RayActorError):
        return WorkerError(role, rank, method, f"the worker process died ({type(exc).__name__})", str(exc), exc,
                           lost=True)
    if isinstance(exc, rex.RayTaskError):
        return WorkerError(role, rank, method, f"{type(cause).__name__}: {cause}", str(exc), cause)
    return WorkerError(role, rank, method, f"{type(exc).__name__}: {exc}", "", exc)


def _method_call(worker: Any, rank: int, method: str, args: tuple, kwargs: dict) -> Any:  # noqa: ARG001
    """A worker method as a generic call (a method sent on the control channel)."""
    return getattr(worker, method)(*args, **kwargs)


#: at most this many stuck ranks have their stacks read into a timeout's error
STACKS_OF = 4
#: the frames of a worker's stack that run its calls (see :mod:`rlweave.scheduler.stacks`)
CALL_FRAMES = "scheduler/ray_impl/actor.py"

#: longest single ``ray.wait`` inside :meth:`RayWorkerGroup.wait`; between two, dead ranks are looked up
WAIT_SLICE_S = 1.0


def dead_rank_error(dead: list[DeadRank], waiting_for: str) -> WorkerError:
    """The error for ranks found dead while the controller waited on ``waiting_for``."""
    first = dead[0]
    others = "".join(f"; also {d.role} rank {d.rank}" for d in dead[1:])
    return WorkerError(first.role, first.rank, f"(between calls, while waiting for {waiting_for})",
                       f"the worker process died: {first.reason}{others}", "", None, lost=True)


class RayWorkerGroup(WorkerGroup):
    """Pending entries are ``(rank, method, ObjectRef)``. Its actors are watched by
    :data:`~rlweave.scheduler.ray_impl.liveness.LIVENESS` until :meth:`kill`: a wait on any
    group raises :class:`WorkerError` (``lost``) as soon as a rank of any group is found dead.
    ``stack_sources`` (rank -> :class:`~rlweave.scheduler.stacks.StackSource`, set by the
    builder once the ranks are up) lets a timeout show where the stuck ranks are."""

    def __init__(self, name: str, actors: list[Any], control: bool = False, concurrent_calls: int = 1):
        self.name = name
        self.actors = actors
        #: the actors have a control channel (``WorkerActor.control_apply`` in the ``control`` group)
        self.control = control
        #: ``generate`` calls a rank runs at once (above 1: in the ``generate`` group)
        self.concurrent_calls = max(1, int(concurrent_calls))
        self.world_size = len(actors)
        self._killed = False
        self.stack_sources: dict[int, stacks.StackSource | None] = {}
        #: rank -> the file holding its output (named in its errors), when it has one
        self.log_files: dict[int, str] = {}
        for rank, actor in enumerate(actors):
            LIVENESS.register(name, rank, actor)

    def submit(self, method: str, ranks: Sequence[int], rank_args: Sequence[RankArgs], on_actor: bool = False,
               fn: Callable[..., Any] | None = None, control: bool = False) -> list:
        if self._killed:
            raise RuntimeError(f"role {self.name!r}: its workers were shut down")
        out = []
        for rank, (args, kwargs) in zip(ranks, rank_args):
            actor = self.actors[rank]
            if control and self.control:
                call, call_args, call_kw = (fn, tuple(args), dict(kwargs)) if fn is not None else \
                    (_method_call, (method, tuple(args), dict(kwargs)), {})
                ref = actor.control_apply.options(concurrency_group=CONTROL_GROUP).remote(method, call, call_args,
                                                                                          call_kw)
            elif fn is not None:
                ref = actor.apply.remote(method, fn, tuple(args), dict(kwargs))
            elif on_actor:
                ref = getattr(actor, method).remote(*args, **kwargs)
            elif method == "generate" and self.concurrent_calls > 1:
                ref = actor.call.options(concurrency_group=GENERATE_GROUP).remote(method, tuple(args), dict(kwargs))
            else:
                ref = actor.call.remote(method, tuple(args), dict(kwargs))
            out.append((rank, method, ref))
        return out

    def wait(self, pending: list, timeout: float | None = None) -> list[Any]:
        import ray

        if not pending:
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        by_ref = {p[2]: p for p in pending}
        results: dict[Any, Any] = {}
        left = [p[2] for p in pending]
        method = pending[0][1]
        while left:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            slice_s = WAIT_SLICE_S if remaining is None else min(WAIT_SLICE_S, remaining)
            ready, left = ray.wait(left, num_returns=1, timeout=slice_s)
            if not ready:
                if deadline is not None and time.monotonic() >= deadline:
                    ranks = sorted(by_ref[r][0] for r in left)
                    raise WorkerTimeout(self.name, method, ranks, float(timeout or 0.0),
                                        stacks=self.stacks_of(ranks[:STACKS_OF]))
                dead = LIVENESS.dead()
                if dead:
                    waiting = {by_ref[r][0] for r in left}
                    mine = [d for d in dead if d.role == self.name and d.rank in waiting]
                    if mine:
                        raise WorkerError(self.name, mine[0].rank, method,
                                          f"the worker process died: {mine[0].reason}", "", None, lost=True,
                                          log_file=self.log_files.get(mine[0].rank))
                    raise dead_rank_error(dead, f"{self.name}.{method}()")
                continue
            for ref in ready:
                rank, method, _ = by_ref[ref]
                try:
                    value = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - mapped to WorkerError
                    raise to_worker_error(exc, self.name, rank, method).with_log(self.log_files.get(rank)) from None
                if isinstance(value, Timed):  # a call of the worker: its span on the run's timeline
                    TRACE.span(self.name, rank, method, value.start, value.end)
                    value = value.value
                results[ref] = value
        return [results[p[2]] for p in pending]

    def stacks_of(self, ranks: Sequence[int]) -> dict[int, str]:
        """rank -> the frames of the thread running its call (or why they cannot be read)."""
        return {r: stacks.calls_in(stacks.dump(self.stack_sources.get(r)), CALL_FRAMES) for r in ranks}

    def done(self, pending: list) -> bool:
        import ray

        refs = [p[2] for p in pending]
        if not refs:
            return True
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) == len(refs)

    @classmethod
    def wait_any(cls, calls: Sequence[tuple[WorkerGroup, list[Any]]], timeout: float) -> None:
        """One ``ray.wait`` over the results not yet in of every call's ranks, until one more
        is in; returns when a call has all of its ranks' results (a call of several ranks may
        have some in already), or after ``timeout``."""
        import ray

        deadline = time.monotonic() + timeout
        refs = [[p[2] for p in pending] for _, pending in calls]
        everything = list(dict.fromkeys(r for call in refs for r in call))  # ray.wait takes each ref once
        if not everything or any(not call for call in refs):
            return
        while True:
            ready, waiting = ray.wait(everything, num_returns=len(everything), timeout=0)
            have = set(ready)
            if any(all(r in have for r in call) for call in refs):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ray.wait(waiting, num_returns=1, timeout=left)

    def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        import ray

        for actor in self.actors:
            LIVENESS.unregister(actor)
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
