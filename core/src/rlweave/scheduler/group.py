"""Framework-agnostic worker group: what a role handle needs from an execution backend.

A worker group owns the rank workers of one role and runs methods on them. The Ray
implementation (:mod:`rlweave.scheduler.ray_impl`) runs each rank in its own actor; the
in-process one (:mod:`rlweave.scheduler.local`) runs them in the controller (tests, a GPU
box without Ray). Role handles (:mod:`rlweave.scheduler.handle`) add dispatch on top and
never touch the backend directly.

Contract:

* :meth:`submit` starts ``method`` on the given ranks, each with its own arguments, and
  returns at once with one opaque pending entry per rank (calls on one rank run in
  submission order).
* :meth:`wait` returns the ranks' results in the order of ``pending``. It raises
  :class:`~rlweave.worker_errors.WorkerError` as soon as any rank fails (without waiting
  for the others, which may be stuck in a collective with the failed rank) and
  :class:`~rlweave.worker_errors.WorkerTimeout` when ``timeout`` runs out.
* :meth:`kill` ends every rank; it is idempotent and never raises.
* :meth:`wait_any` (a class method) blocks until one of several calls, of groups of one class, has
  finished or a timeout passed; it returns nothing and raises nothing (``wait`` reports how a call
  ended). The default looks at the calls every :data:`LOOK_S` seconds; a backend that can block
  on the calls themselves overrides it (Ray: one ``ray.wait`` over every rank's result), so a
  controller waiting on the engine's requests and the trainer at once sleeps until one ends.

Control channel: with ``control=True`` a call goes to the rank's control channel, which is
never queued behind the rank's other calls, where the group has one (a Ray rank whose worker
class sets ``control_plane = True``: a concurrency group of its own); elsewhere it runs like
any call. The worker decides what is safe to run beside its other calls (see
``RolloutEngine.control_plane``).

Concurrent generate calls: :attr:`WorkerGroup.concurrent_calls` ``generate`` calls of a rank
run at once where the group says more than 1 (a Ray rank whose engine class sets
``RolloutEngine.concurrent_calls``: a concurrency group of its own), so calls sent one after
the other share the engine's running batch; calls on one rank then finish in any order.

Generic calls: with ``fn`` given, each rank runs ``fn(worker, rank, *args, **kwargs)`` in its
own process instead of a worker method, and ``method`` only names the call (in errors, fault
injection and timeouts). This is how components that own both ends of an exchange (weight-sync
transports) reach the ranks without methods of their own on the rank wrapper. ``fn`` must be
importable by reference (a module-level function).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

#: One call's arguments for one rank: ``(args, kwargs)``.
RankArgs = tuple[tuple[Any, ...], dict[str, Any]]
#: seconds between looks of the default :meth:`WorkerGroup.wait_any`
LOOK_S = 0.002


class WorkerGroup(ABC):
    name: str
    world_size: int
    #: ``generate`` calls a rank runs at once (see the module contract)
    concurrent_calls: int = 1

    @abstractmethod
    def submit(
        self, method: str, ranks: Sequence[int], rank_args: Sequence[RankArgs], on_actor: bool = False,
        fn: Callable[..., Any] | None = None, control: bool = False,
    ) -> list[Any]:
        """Start ``method`` on ``ranks`` (``rank_args[i]`` for ``ranks[i]``). ``on_actor``
        targets the rank's wrapper (``address``, ``placement``) instead of the worker object;
        ``fn``: a generic call named ``method``; ``control``: on the control channel (see the
        module contract)."""

    @abstractmethod
    def wait(self, pending: list[Any], timeout: float | None = None) -> list[Any]:
        """Results of ``pending`` in order; see the module contract for failures."""

    @abstractmethod
    def done(self, pending: list[Any]) -> bool:
        """True when every entry has finished (successfully or not)."""

    @abstractmethod
    def kill(self) -> None:
        """End all ranks now (idempotent, never raises)."""

    @classmethod
    def wait_any(cls, calls: Sequence[tuple[WorkerGroup, list[Any]]], timeout: float) -> None:
        """Return once one of ``calls`` (``(group, pending)`` pairs, groups of this class) has
        finished, or after ``timeout`` seconds; see the module contract."""
        look_until(lambda: any(group.done(pending) for group, pending in calls), timeout)


def look_until(ready: Callable[[], bool], timeout: float) -> None:
    """Call ``ready()`` every :data:`LOOK_S` seconds until it is true or ``timeout`` seconds
    passed (the default :meth:`WorkerGroup.wait_any`)."""
    deadline = time.monotonic() + timeout
    while not ready():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(LOOK_S, left))
