"""A small pool of reward worker processes that survives bad reward functions.

Contract of :meth:`RewardPool.run`: every call gets exactly one outcome —
``("ok", value)``, ``("error", message)`` (the function raised or returned a non-number),
``("timeout", message)`` (it ran past ``timeout_s``; its worker is killed and replaced) or
``("crash", message)`` (its worker process died, e.g. ``os._exit`` or a segfault; replaced).
Only a reward that cannot even be imported in a worker raises (:class:`RewardWorkerError`):
that is a configuration error, not a bad sample.

Each worker runs in a sandbox (:class:`~rlweave.sandbox.limits.SandboxLimits`, from
``reward_runtime.sandbox``): an address-space limit (an allocation beyond it is an
``error``), a CPU budget per call (an endless loop is an ``error`` after ``cpu_s`` CPU
seconds and the worker stays; ``timeout`` still applies), its own temporary directory as cwd
and ``TMPDIR``, and refusal of process starts (default) and network access (opt-in) as an
``error`` naming the option. A worker leads its own session and process group: a killed or
replaced worker is killed with every process it started, its directory is removed, and
after every call the worker kills what that call left running. These limits guard against
accidents and runaway code, not against deliberately malicious native code.

Workers are started with the ``spawn`` method by default (safe in processes that hold
threads, e.g. a Ray driver); the calling script therefore needs the usual
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, fields, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from rlweave.sandbox.limits import PREFIX, SandboxLimits
from rlweave.sandbox.proctree import kill_tree
from rlweave.sandbox.worker import worker_main
from rlweave.targets import absolute_reference

Outcome = tuple[str, Any]

#: calls a worker holds at once: the one it runs and the next ones, already in its pipe, so it
#: never waits for the parent between two calls. A call's timeout starts when the worker's
#: previous call has answered; calls queued behind one that kills or hangs its worker are handed
#: out again (to any worker) once that call's outcome is known.
PIPELINE = 4

#: pools not closed yet; closed at interpreter exit (registered after multiprocessing's own
#: exit handler, so it runs first, while the workers still answer)
_OPEN: weakref.WeakSet[RewardPool] = weakref.WeakSet()


class RewardWorkerError(RuntimeError):
    """Reward workers cannot start (a reward fails to import in a fresh process, or workers
    keep dying before they are ready)."""


@dataclass
class _Slot:
    proc: Any
    conn: Connection
    started: float
    ready: bool = False
    busy: tuple[int, float] | None = None  # (call index, deadline) of the call the worker runs now
    waiting: deque = field(default_factory=deque)  # calls sent behind it, not started yet
    pending_send: list[Any] = field(default_factory=list)
    workdir: str | None = None  # private directory, removed when the worker is gone


class RewardPool:
    """``workers`` processes, each loading ``targets`` (``module:function`` strings) once.

    Args:
        targets: reward functions by import string; calls name them by index.
        workers: number of processes.
        timeout_s: per-call limit, counted from when the worker starts the call (it reached an idle
            worker, or the worker's previous call answered; see :data:`PIPELINE`).
        start_method: multiprocessing start method (``spawn`` default, ``forkserver``, ``fork``).
        start_timeout_s: how long a worker may take to import the rewards.
        sandbox: limits of each worker: a :class:`SandboxLimits` or the config's
            ``reward_runtime.sandbox`` (``None``: the defaults); ``cpu_s=None`` means ``timeout_s``.
        numeric: the functions are rewards (an ``ok`` value is a finite float); False: any
            value, returned as text (a string as it is, anything else as JSON): tools.
    """

    def __init__(
        self,
        targets: list[str],
        workers: int = 2,
        timeout_s: float = 5.0,
        start_method: str = "spawn",
        start_timeout_s: float = 120.0,
        sandbox: Any = None,
        numeric: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError(f"reward workers must be >= 1, got {workers}")
        self.targets = [absolute_reference(t) for t in targets]  # workers may run in their own directory
        self.workers = workers
        self.numeric = bool(numeric)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        if sandbox is None:
            sandbox = SandboxLimits()
        elif not isinstance(sandbox, SandboxLimits):  # the config model, or anything with the same fields
            sandbox = SandboxLimits(**{f.name: getattr(sandbox, f.name) for f in fields(SandboxLimits)})
        self.sandbox = sandbox if sandbox.cpu_s is not None else replace(sandbox, cpu_s=self.timeout_s)
        self._ctx = mp.get_context(start_method)
        self._slots: list[_Slot] = []
        _OPEN.add(self)
        self._early_deaths = 0
        self.replaced = 0  #: workers killed or found dead and replaced so far

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn(self) -> _Slot:
        workdir = tempfile.mkdtemp(prefix="rlweave-reward-") if self.sandbox.private_dir else None
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=worker_main, args=(child, self.targets, self.sandbox, workdir, self.numeric), daemon=True,
            name="rlweave-reward-worker",
        )
        try:
            proc.start()
        except BaseException:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        child.close()
        return _Slot(proc=proc, conn=parent, started=time.monotonic(), workdir=workdir)

    def _ensure_started(self) -> None:
        while len(self._slots) < self.workers:
            self._slots.append(self._spawn())

    @staticmethod
    def _kill(slot: _Slot) -> None:
        """Kill the worker and every process it started (it is not reaped before this, so
        its pid and group id are still its own), reap it, remove its directory."""
        if slot.proc.pid is not None:
            kill_tree(slot.proc.pid)
        slot.proc.join(timeout=10)
        slot.conn.close()
        if slot.workdir is not None:
            shutil.rmtree(slot.workdir, ignore_errors=True)

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
        pending = [s.proc.sentinel for s in self._slots]
        while pending and time.monotonic() < deadline:  # exited, not yet reaped (see _kill)
            done = wait(pending, timeout=max(0.0, deadline - time.monotonic()))
            pending = [p for p in pending if p not in done]
        for slot in self._slots:
            self._kill(slot)
        self._slots = []
        _OPEN.discard(self)

    # -- running calls ---------------------------------------------------------------------
    def run(self, calls: list[tuple[int, dict[str, Any]]]) -> list[Outcome]:
        """Run ``(fn_index, kwargs)`` calls; outcomes in call order (see module docstring)."""
        results: list[Outcome | None] = [None] * len(calls)
        queue = deque(range(len(calls)))
        remaining = len(calls)
        self._ensure_started()
        while remaining:
            now = time.monotonic()
            for slot in self._slots:  # hand out work: the call to run, then the next behind it
                while slot.ready and queue and (slot.busy is None or len(slot.waiting) < PIPELINE - 1):
                    i = queue.popleft()
                    try:
                        slot.conn.send((i, calls[i][0], calls[i][1]))
                    except (OSError, ValueError):
                        queue.appendleft(i)  # worker died; its sentinel fires below
                        break
                    if slot.busy is None:
                        slot.busy = (i, now + self.timeout_s)
                    else:
                        slot.waiting.append(i)
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
                    died, answered = self._drain(slot, results)
                    remaining -= answered
                if died or slot.proc.sentinel in ready:  # the sentinel is ready once the worker exited
                    queue.extendleft(reversed(slot.waiting))  # never started: they go to another worker
                    slot.waiting.clear()
                    if slot.busy is not None:
                        results[slot.busy[0]] = ("crash", self._died(slot))
                        remaining -= 1
                    elif not slot.ready:
                        self._early_deaths += 1
                        if self._early_deaths >= 3 * self.workers:
                            self.close()
                            raise RewardWorkerError(
                                f"reward workers keep dying while importing {self.targets} ({self._died(slot)})"
                            )
                    self._replace(k)
            now = time.monotonic()
            for k in range(len(self._slots)):
                slot = self._slots[k]
                if slot.busy is not None and now >= slot.busy[1]:
                    results[slot.busy[0]] = ("timeout", f"reward call exceeded {self.timeout_s:g}s; worker killed")
                    remaining -= 1
                    queue.extendleft(reversed(slot.waiting))
                    slot.waiting.clear()
                    self._replace(k)
                elif not slot.ready and now >= slot.started + self.start_timeout_s:
                    self.close()
                    raise RewardWorkerError(
                        f"a reward worker did not start within {self.start_timeout_s:g}s (importing {self.targets})"
                    )
        return results  # type: ignore[return-value]

    def _died(self, slot: _Slot) -> str:
        """Why a worker is gone: how it ended (read without reaping it, see :meth:`_kill`),
        and the memory limit as a likely cause when one is set (native code may abort when an
        allocation fails)."""
        code, how = _ending(slot.proc.pid)
        why = f"reward worker process died ({how})"
        if self.sandbox.memory_mb is not None and code is not None and code < 0:
            why += f"; workers may map at most {self.sandbox.memory_mb} MiB ({PREFIX}.memory_mb)"
        return why

    def _drain(self, slot: _Slot, results: list[Outcome | None]) -> tuple[bool, int]:
        """Read every message waiting on ``slot``; return whether the worker is gone and how
        many calls it answered."""
        answered = 0
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
                        answered += 1
                        # the worker goes on with the next call in its pipe: its clock starts now
                        slot.busy = (slot.waiting.popleft(), time.monotonic() + self.timeout_s) if slot.waiting \
                            else None
        except (EOFError, OSError):
            return True, answered
        return False, answered

    def __del__(self) -> None:  # best effort; RewardSet.close() is the contract
        try:
            if self._slots:
                self.close()
        except Exception:
            pass


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_OPEN):
        try:
            pool.close()
        except Exception:  # noqa: BLE001, S110 - exiting anyway; the others still get closed
            pass


def _ending(pid: int | None, timeout_s: float = 2.0) -> tuple[int | None, str]:
    """Exit code (``-signal`` when killed by one) and ``exit code N`` / ``exit code -N,
    SIGNAME`` of an exited child, which is left unreaped; ``None`` when unknown."""
    end = time.monotonic() + timeout_s
    while pid is not None and hasattr(os, "waitid"):
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is not None:
            if info.si_code == os.CLD_EXITED:
                return info.si_status, f"exit code {info.si_status}"
            try:
                name = signal.Signals(info.si_status).name
            except ValueError:
                name = f"signal {info.si_status}"
            return -info.si_status, f"exit code {-info.si_status}, {name}"
        if time.monotonic() >= end:
            return None, "exit code unknown: still running"
        time.sleep(0.005)
    return None, "exit code unknown"
