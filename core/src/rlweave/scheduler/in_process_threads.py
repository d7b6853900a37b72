"""Calls of in-process roles on threads of their own, so generation and training overlap.

With ``run.scheduler: in_process`` and ``run.in_process_threads``,
:class:`~rlweave.scheduler.in_process.InProcessRoleBuilder` wraps each role's group in a
:class:`ThreadedWorkerGroup` instead of running its calls in the controller's thread, so that
the run modes that overlap generation and training (``one_step_off``, ``async``) do:

* **Lanes.** A :class:`CallLane` is one thread that runs the calls given to it in order. Every
  training role (backends: policy, reference, critic, reward models) shares one lane, so their
  calls never run at once (they may share this process's one process group); each engine role
  has a lane of its own, so its ``generate`` runs while a training role computes.
* **Control channel.** An engine whose class says ``control_plane = True`` gets a second lane
  for ``control=True`` calls (weight loading, the weight dtype and version, ``abort``), never
  queued behind its ``generate`` calls, as on Ray (see ``RolloutEngine.control_plane``). Other
  roles run control calls on their lane, in order.
* **Futures.** ``submit`` returns at once; ``wait`` raises a rank's
  :class:`~rlweave.worker_errors.WorkerError` as soon as it fails and
  :class:`~rlweave.worker_errors.WorkerTimeout` when ``timeout`` runs out, with the stack of
  the lane's thread (the call goes on: nothing can stop a thread); ``wait_any`` sleeps until one call ends.
* **Devices.** A call runs with the CUDA device that was current in the submitting thread when
  this process uses CUDA (each thread has its own current device), and frees the OpenMP workers
  its thread started when it ends (:func:`rlweave.devices.openmp.releasing`).

A call that hangs hangs its lane and, at exit, the process: these are ordinary (not daemon)
threads, so that a call is never cut off half-way when the controller ends.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Callable

from rlweave.devices.openmp import releasing
from rlweave.scheduler.group import RankArgs, WorkerGroup
from rlweave.worker_errors import WorkerTimeout


def _current_cuda_device() -> int | None:
    """The calling thread's current CUDA device when this process has initialised CUDA, else None
    (never imports torch or initialises CUDA itself)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_device())


def _on_device(device: int | None, call: Callable[[], Any]) -> Any:
    """``call()`` with ``device`` (when not None) as this thread's current CUDA device."""
    if device is not None:
        import torch

        if torch.cuda.current_device() != device:
            torch.cuda.set_device(device)
    return call()


class CallLane:
    """One thread that runs the calls given to it, in the order given; ``name`` names the thread."""

    def __init__(self, name: str):
        self.name = name
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rlweave-{name}")
        self._thread: int | None = None  # the lane thread's id, once it ran a call

    def run(self, call: Callable[[], Any]) -> cf.Future:
        """``call()`` on this lane, after the calls given before it, with the submitting thread's
        CUDA device; its future holds what it returns."""
        # then the OpenMP workers the lane's thread started are freed (rlweave.devices.openmp)
        return self._pool.submit(self._on_lane, releasing(_on_device), _current_cuda_device(), call)

    def _on_lane(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._thread = threading.get_ident()
        return fn(*args)

    def stack(self, frames: int = 12) -> str:
        """Where the lane's thread is now: its ``frames`` innermost frames, most recent call
        first (the layout of :mod:`rlweave.scheduler.stacks`)."""
        frame = sys._current_frames().get(self._thread) if self._thread is not None else None
        if frame is None:
            return "(no stack: the lane runs no call)"
        entries = traceback.extract_stack(frame)[::-1]
        lines = [f'  File "{e.filename}", line {e.lineno} in {e.name}' for e in entries[:frames]]
        more = len(entries) - frames
        return "\n".join([f"Thread {self.name} (most recent call first):"] + lines
                         + ([f"  ... {more} outer frame(s)"] if more > 0 else []))

    def close(self) -> None:
        """Drop the calls not started, let the running one end; idempotent."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class ThreadedWorkerGroup(WorkerGroup):
    """``inner``'s calls (a group whose calls run at submission in this process, such as an
    :class:`~rlweave.scheduler.in_process.InProcessWorkerGroup`) on ``lane``, and its control
    calls on ``control`` when given; see the module docstring. ``workers`` and ``devices`` are
    ``inner``'s."""

    def __init__(self, inner: Any, lane: CallLane, control: CallLane | None = None):
        self.inner, self.lane, self.control_lane = inner, lane, control
        self.name, self.world_size = inner.name, inner.world_size

    @property
    def workers(self) -> list[Any]:
        return self.inner.workers

    @property
    def devices(self) -> list[str]:
        return self.inner.devices

    def submit(self, method: str, ranks: Sequence[int], rank_args: Sequence[RankArgs], on_actor: bool = False,
               fn: Any = None, control: bool = False) -> list:
        lane = self.control_lane if control and self.control_lane is not None else self.lane
        run = self.inner.submit
        return [(lane.run(lambda r=rank, a=args: run(method, [r], [a], on_actor=on_actor, fn=fn)[0]), rank, method)
                for rank, args in zip(ranks, rank_args)]

    def kill(self) -> None:
        self.inner.kill()

    def wait(self, pending: list, timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        left = {fut for fut, _, _ in pending}
        while left:
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, left = cf.wait(left, timeout=wait_s, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                ok, value = fut.result()
                if not ok:
                    raise value
            if left and deadline is not None and time.monotonic() >= deadline:
                ranks = [rank for fut, rank, _ in pending if fut in left]
                raise WorkerTimeout(self.name, pending[0][2], ranks, float(timeout), stacks={ranks[0]: self.lane.stack()})
        return [fut.result()[1] for fut, _, _ in pending]

    def done(self, pending: list) -> bool:
        return all(fut.done() for fut, _, _ in pending)

    @classmethod
    def wait_any(cls, calls: Sequence[tuple[Any, list[Any]]], timeout: float) -> None:
        futures = [fut for _, pending in calls for fut, _, _ in pending]
        if futures:
            cf.wait(futures, timeout=timeout, return_when=cf.FIRST_COMPLETED)
