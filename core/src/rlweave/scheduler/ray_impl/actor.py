"""The generic Ray actor that hosts one rank's plain worker object.

The actor is created empty (cheap), tells the controller its node address and a free port
(rank 0's become the role's rendezvous), then :meth:`WorkerActor.setup` builds
``worker_cls(WorkerContext)``. Calls are forwarded by name through :meth:`call`, which returns
the result with when the call ran (:class:`~rlweave.scheduler.trace.Timed`: the run's timeline,
unwrapped by the group). Any
exception leaves the actor as a :class:`~rlweave.worker_errors.RemoteFailure` carrying
role, rank, method and the formatted traceback, so the controller can name them.

:meth:`WorkerActor.apply` runs a module-level function on the worker instead of one of its
methods: the generic call of :mod:`rlweave.scheduler.group`, through which weight-sync
transports run their rank-side ends (the actor knows nothing of weight sync).

Output: given a ``log_file``, the actor sends its process's output there before anything else
(:mod:`rlweave.scheduler.worker_log`).

Stacks: the actor arms its process so that the controller can read every thread's stack
from outside when a call hangs (:mod:`rlweave.scheduler.stacks`); :meth:`WorkerActor.placement`
says where they are written (``stack_fd``).

Control channel: for a worker class with ``control_plane = True`` the actor is made with a
Ray concurrency group :data:`CONTROL_GROUP` of its own (:func:`remote_actor_class`), and
:meth:`WorkerActor.control_apply` runs there, on another thread, never queued behind the
calls of the default group (which still run one at a time). An engine class whose
``concurrent_calls`` is above 1 also gets the group :data:`GENERATE_GROUP`, where that many of
its ``generate`` calls run at once, each on a thread of its own. Other actors have no such
groups and stay single-threaded (calls in submission order).

A call that ran on a thread other than the main one (a concurrency group's) frees the OpenMP
worker threads it started when it ends (:mod:`rlweave.devices.openmp`), so the process never
keeps a pool for each thread that once computed: with more pool threads than CPUs every
parallel region of the process slows down, the engine's generate call included.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from typing import Any, Callable

from rlweave.devices.openmp import release_off_main
from rlweave.scheduler import stacks
from rlweave.scheduler.faults import FaultPlan
from rlweave.scheduler.trace import Timed
from rlweave.scheduler.worker_log import redirect_output
from rlweave.scheduler.ray_impl import process
from rlweave.scheduler.ray_impl.process import ProcessSettings
from rlweave.worker_errors import RemoteFailure, WorkerLost


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class WorkerActor:
    """Wraps ``worker_cls`` for one rank. Not decorated: :func:`remote_actor_class` applies
    ``ray.remote`` at run time so importing this module does not import Ray."""

    def __init__(self, worker_cls: type, role: str, rank: int, log_file: str | None = None):
        if log_file:  # the rank's own output goes to the run's logs, not the user's console
            redirect_output(log_file)
        self._cls, self._role, self._rank = worker_cls, role, rank
        self.worker: Any = None
        self.applied: ProcessSettings | None = None  # what setup applied to this process
        self._faults = FaultPlan(role, rank)  # test-only fault injection (rlweave.scheduler.faults)
        self._stacks = stacks.install()  # the controller can read where a hung call is

    def _fail(self, method: str, exc: BaseException) -> RemoteFailure:
        import pickle

        try:
            carried = pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - not picklable: type, message and traceback still travel
            carried = None
        return RemoteFailure(self._role, self._rank, method, type(exc).__qualname__, str(exc),
                             traceback.format_exc(), carried, lost=isinstance(exc, WorkerLost))

    def address(self) -> tuple[str, int]:
        """This node's address as Ray sees it, and a free TCP port on it."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, _free_port(host)

    def placement(self) -> dict[str, Any]:
        """Where Ray put this rank: pid, node (address and Ray node id: several nodes may
        share an address), placement group, GPU ids, CPU threads,
        whether this process keeps freed memory for reuse (``cpu_malloc_reuse``, as applied by
        :meth:`setup`; None before it), and ``stack_fd``, the descriptor its stacks are written
        to (:mod:`rlweave.scheduler.stacks`)."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ctx.get_node_id(),
            "placement_group_id": ctx.get_placement_group_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "accelerator_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
            "cpu_malloc_reuse": None if self.applied is None else self.applied.cpu_malloc_reuse,
            "stack_fd": self._stacks.fd,
        }

    def setup(self, ctx: Any, device_kind: str, settings: ProcessSettings | None = None) -> None:
        """Build the worker. ``device_kind`` is the pool's kind: a ``gpu`` pool gives
        ``ctx.device = "cuda"`` when this process sees CUDA, else ``"cpu"`` (virtual devices).
        Before the worker is built, ``settings`` (default: :class:`ProcessSettings`'s) are
        applied to this process (:func:`.process.apply`: on a CPU device its intra-op threads
        and, with ``cpu_malloc_reuse``, freed memory kept for reuse); what was applied is kept
        in ``self.applied`` and reported by :meth:`placement`."""
        try:
            if device_kind == "gpu":
                import torch

                ctx.device = "cuda" if torch.cuda.is_available() else "cpu"
            else:
                ctx.device = "cpu"
            self.applied = process.apply(settings or ProcessSettings(), ctx.device, ctx.world_size)
            self.worker = self._cls(ctx)
        except BaseException as exc:  # noqa: BLE001
            raise self._fail("__init__", exc) from None
        finally:
            release_off_main()  # see the module docstring

    def call(self, method: str, args: tuple, kwargs: dict) -> Timed:
        """``worker.<method>(*args, **kwargs)``, with when it ran (:class:`~rlweave.scheduler.trace.Timed`)."""
        start = time.time()
        try:
            if self.worker is None:
                raise RuntimeError("worker not set up")
            fn = getattr(self.worker, method, None)
            if fn is None:
                raise AttributeError(f"{type(self.worker).__name__} has no method {method!r}")
            self._faults.before(method)
            value = fn(*args, **kwargs)
            return Timed(value, start, time.time())
        except BaseException as exc:  # noqa: BLE001
            raise self._fail(method, exc) from None
        finally:
            release_off_main()  # see the module docstring

    def control_apply(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Timed:
        """:meth:`apply` on the control channel (see the module docstring)."""
        return self.apply(name, fn, args, kwargs)

    def apply(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Timed:
        """The generic call (see :mod:`rlweave.scheduler.group`): ``fn(worker, rank, *args,
        **kwargs)`` in this process, with when it ran; ``name`` names it in faults and errors."""
        start = time.time()
        try:
            if self.worker is None:
                raise RuntimeError("worker not set up")
            self._faults.before(name)
            return Timed(fn(self.worker, self._rank, *args, **kwargs), start, time.time())
        except BaseException as exc:  # noqa: BLE001
            raise self._fail(name, exc) from None
        finally:
            release_off_main()  # see the module docstring


#: the Ray concurrency group of the control channel, and how many control calls run at once
CONTROL_GROUP = "control"
CONTROL_CONCURRENCY = 2
#: the Ray concurrency group of ``generate`` calls of an engine that serves several at once
GENERATE_GROUP = "generate"

_REMOTE: dict[tuple[bool, int], Any] = {}


def remote_actor_class(control: bool = False, generate_calls: int = 1) -> Any:
    """``ray.remote(WorkerActor)``: with ``control``, with the :data:`CONTROL_GROUP`
    concurrency group; with ``generate_calls`` > 1, with the :data:`GENERATE_GROUP` group
    running that many calls at once. Built once per process and kind."""
    key = (bool(control), max(1, int(generate_calls)))
    if key not in _REMOTE:
        import ray

        groups = {CONTROL_GROUP: CONTROL_CONCURRENCY} if key[0] else {}
        if key[1] > 1:
            groups[GENERATE_GROUP] = key[1]
        _REMOTE[key] = ray.remote(concurrency_groups=groups)(WorkerActor) if groups else ray.remote(WorkerActor)
    return _REMOTE[key]
