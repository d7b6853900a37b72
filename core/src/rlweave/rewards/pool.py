"""A small pool of reward worker processes that survives bad reward functions.

Contract of :meth:`RewardPool.run`: every call gets exactly one outcome —
``("ok", value)``, ``("error", message)`` (the function raised or returned a non-number),
``("timeout", message)`` (it ran past ``timeout_s``; its worker is killed and replaced) or
``("crash", message)`` (its worker process died, e.g. ``os._exit`` or a segfault; replaced).
Only a reward that cannot even be imported in a worker raises (:class:`RewardWorkerError`):
that is a configuration error, not a bad sample.

Workers are started with the ``spawn`` method by default (safe in processes that hold
threads, e.g. a Ray driver); the calling script therefore needs the usual
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from rlweave.rewards._worker import worker_main

Outcome = tuple[str, Any]


class RewardWorkerError(RuntimeError):
    """Reward workers cannot start (a reward fails to import in a fresh process, or workers
    keep dying before they are ready)."""


@dataclass
class _Slot:
    proc: Any
    conn: Connection
    started: float
    ready: bool = False
    busy: tuple[int, float] | None = None  # (call index, deadline)
    pending_send: list[Any] = field(default_factory=list)


class RewardPool:
    """``workers`` processes, each loading ``targets`` (``module:function`` strings) once.

    Args:
        targets: reward functions by import string; calls name them by index.
        workers: number of processes.
        timeout_s: per-call limit, counted from when the call reaches an idle ready worker.
        start_method: multiprocessing start method (``spawn`` default, ``forkserver``, ``fork``).
        start_timeout_s: how long a worker may take to import the rewards.
    """

    def __init__(
        self,
        targets: list[str],
        workers: int = 2,
        timeout_s: float = 5.0,
        start_method: str = "spawn",
        start_timeout_s: float = 120.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"reward workers must be >= 1, got {workers}")
        self.targets = list(targets)
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self._ctx = mp.get_context(start_method)
        self._slots: list[_Slot] = []
        self._early_deaths = 0
        self.replaced = 0  #: workers killed or found dead and replaced so far

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn(self) -> _Slot:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=worker_main, args=(child, self.targets), daemon=True, name="rlweave-reward-worker"
        )
        proc.start()
        child.close()
        return _Slot(proc=proc, conn=parent, started=time.monotonic())

    def _ensure_started(self) -> None:
        while len(self._slots) < self.workers:
            self._slots.append(self._spawn())

    @staticmethod
    def _kill(slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(timeout=10)
        slot.conn.close()

    def _replace(self, i: int) -> None:
        self._kill(self._slots[i])
        self._slots[i] = self._spawn()
        self.replaced += 1

    def close(self) -> None:
        """Stop all workers (politely, then by force)."""
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for slot in self._slots:
            slot.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(slot)
        self._slots = []

    # -- running calls ---------------------------------------------------------------------
    def run(self, calls: list[tuple[int, dict[str, Any]]]) -> list[Outcome]:
        """Run ``(fn_index, kwargs)`` calls; outcomes in call order (see module docstring)."""
        results: list[Outcome | None] = [None] * len(calls)
        queue = deque(range(len(calls)))
        remaining = len(calls)
        self._ensure_started()
        while remaining:
            now = time.monotonic()
            for slot in self._slots:  # hand out work
                if slot.ready and slot.busy is None and queue:
                    i = queue.popleft()
                    try:
                        slot.conn.send((i, calls[i][0], calls[i][1]))
                    except (OSError, ValueError):
                        queue.appendleft(i)  # worker died; its sentinel fires below
                        continue
                    slot.busy = (i, now + self.timeout_s)
            deadlines = [s.busy[1] for s in self._slots if s.busy] + [
                s.started + self.start_timeout_s for s in self._slots if not s.ready
            ]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            objs: list[Any] = [s.conn for s in self._slots] + [s.proc.sentinel for s in self._slots]
            ready = set(wait(objs, timeout=wait_s))
            for k in range(len(self._slots)):
                slot = self._slots[k]
                died = False
                if slot.conn in ready or slot.proc.sentinel in ready:
                    died = self._drain(slot, results)
                if died or (slot.proc.sentinel in ready and not slot.proc.is_alive()):
                    if slot.busy is not None:
                        i = slot.busy[0]
                        results[i] = ("crash", f"reward worker process died (exit code {slot.proc.exitcode})")
                    elif not slot.ready:
                        self._early_deaths += 1
                        if self._early_deaths >= 3 * self.workers:
                            self.close()
                            raise RewardWorkerError(
                                f"reward workers keep dying while importing {self.targets} "
                                f"(last exit code {slot.proc.exitcode})"
                            )
                    self._replace(k)
            now = time.monotonic()
            for k in range(len(self._slots)):
                slot = self._slots[k]
                if slot.busy is not None and now >= slot.busy[1]:
                    results[slot.busy[0]] = ("timeout", f"reward call exceeded {self.timeout_s:g}s; worker killed")
                    self._replace(k)
                elif not slot.ready and now >= slot.started + self.start_timeout_s:
                    self.close()
                    raise RewardWorkerError(
                        f"a reward worker did not start within {self.start_timeout_s:g}s (importing {self.targets})"
                    )
            remaining = sum(r is None for r in results)
        return results  # type: ignore[return-value]

    def _drain(self, slot: _Slot, results: list[Outcome | None]) -> bool:
        """Read every message waiting on ``slot``; return True when the worker is gone."""
        try:
            while slot.conn.poll():
                msg = slot.conn.recv()
                if msg[0] == "ready":
                    slot.ready = True
                    self._early_deaths = 0
                elif msg[0] == "load_error":
                    self.close()
                    raise RewardWorkerError(f"a reward cannot be imported in a worker process:\n{msg[1]}")
                else:
                    call_id, status, payload = msg
                    if slot.busy is not None and slot.busy[0] == call_id:
                        results[call_id] = (status, payload)
                        slot.busy = None
        except (EOFError, OSError):
            return True
        return False

    def __del__(self) -> None:  # best effort; RewardSet.close() is the contract
        try:
            if self._slots:
                self.close()
        except Exception:
            pass
