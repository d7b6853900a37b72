"""In-process worker group: the rank workers live in the controller process.

For tests of dispatch logic and for driving a backend or engine without Ray (a GPU box
with one process). Calls run synchronously at submission, rank by rank, so it cannot run
collectives across ranks; use world size 1 for anything that joins a process group.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Sequence

from rlweave.interfaces.worker import WorkerContext
from rlweave.scheduler.group import RankArgs, WorkerGroup
from rlweave.scheduler.trace import TRACE
from rlweave.worker_errors import WorkerError


class SyncWorkerGroup(WorkerGroup):
    """Base of groups whose calls run at submission in this process: ``submit`` returns
    ``(ok, value_or_WorkerError)`` per rank, ``wait`` raises the first error."""

    def wait(self, pending: list, timeout: float | None = None) -> list[Any]:
        for ok, value in pending:
            if not ok:
                raise value
        return [value for _, value in pending]

    def done(self, pending: list) -> bool:
        return True

    def kill(self) -> None:
        pass


class LocalWorkerGroup(SyncWorkerGroup):
    """``worker_cls(ctx)`` for each given context, called in this process."""

    def __init__(self, name: str, worker_cls: type, contexts: Sequence[WorkerContext]):
        self.name = name
        self.world_size = len(contexts)
        self.workers = [worker_cls(ctx) for ctx in contexts]

    def submit(self, method: str, ranks: Sequence[int], rank_args: Sequence[RankArgs], on_actor: bool = False,
               fn: Callable[..., Any] | None = None, control: bool = False) -> list:  # noqa: ARG002 - calls run at once
        out = []
        for rank, (args, kwargs) in zip(ranks, rank_args):
            start = time.time()
            try:
                if fn is not None:
                    out.append((True, fn(self.workers[rank], rank, *args, **kwargs)))
                else:
                    out.append((True, getattr(self.workers[rank], method)(*args, **kwargs)))
                TRACE.span(self.name, rank, method, start, time.time())  # the run's timeline
            except Exception as exc:  # noqa: BLE001 - reported at wait(), like a remote failure
                out.append((False, WorkerError(self.name, rank, method, f"{type(exc).__name__}: {exc}",
                                               traceback.format_exc(), exc)))
        return out
