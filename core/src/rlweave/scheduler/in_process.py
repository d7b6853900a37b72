"""The in-process scheduler: every role's worker in the controller process, without Ray.

``run.scheduler: in_process`` makes the runner build its roles with :class:`InProcessRoleBuilder`
instead of the Ray :class:`~rlweave.scheduler.ray_impl.build.RoleBuilder`: for a machine where
Ray cannot be installed (a GPU box without network) and for small models, where one process is
all a run needs. Algorithms see the same :class:`~rlweave.scheduler.handle.RoleHandle` objects.

Contract (the builder surface the runner uses: :meth:`~InProcessRoleBuilder.build`,
:meth:`~InProcessRoleBuilder.rebuild`, :meth:`~InProcessRoleBuilder.close`):

* One rank per role: loading the config refuses more (:mod:`rlweave.config.in_process`), and
  the builder raises :class:`~rlweave.config.placement.PlacementError` before building anything
  when handed such a config anyway. The placement is checked as for Ray (pools, colocation,
  parallel sizes), but no device is reserved.
* Each role's worker is ``worker_cls(ctx)`` built here, in role order, with the context of
  :func:`~rlweave.scheduler.contexts.worker_context`; ``ctx.device`` is ``cuda`` for a role in a
  ``gpu`` pool when this process sees CUDA (every such role uses this process's current GPU:
  they share it, as if colocated), else ``cpu``. Its rendezvous is 127.0.0.1 and a free port; a
  worker that joins a process group of its one rank joins the first one formed in this process
  (:meth:`~rlweave.interfaces.worker.Worker.init_distributed` does nothing once one exists), so
  put every training role on one kind of device. Then, with ``init``, every role's
  ``init_model()`` / ``init_engine()``, one after another.
* Calls run when submitted, in the calling thread; their futures are resolved on return. With
  ``run.in_process_threads`` they run on threads instead, an engine role's apart from the
  training roles', so generation and training overlap
  (:mod:`rlweave.scheduler.in_process_threads`); :meth:`close` ends those threads.
  ``roles.<role>.timeouts`` cannot cut a call short here (a hung worker hangs the run), the
  ``RLWEAVE_FAULTS`` injection of the Ray actors does not apply, and the process's threads and
  allocator are left as they are (``roles.<role>.cpu_threads`` and ``ray.cpu_malloc_reuse`` are
  settings of Ray's rank processes).
* A failure while building shuts down what was built, then raises. :meth:`rebuild` raises
  (``run.max_restarts`` must be 0); :meth:`close` shuts every role down and drops its worker,
  so its memory can be freed (idempotent).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlweave.config.placement import PlacementError, check_placement, rank_parallel, spans_of
from rlweave.scheduler.contexts import BuilderInputs, init_method, worker_context
from rlweave.worker_errors import WorkerError
from rlweave.scheduler.handle import RoleHandle
from rlweave.scheduler.local import LocalWorkerGroup

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RunConfig
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.plugins.types import PluginRecord

log = logging.getLogger("rlweave.scheduler")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def device_of(pool_device: str) -> str:
    """``ctx.device`` of a rank in a pool of kind ``pool_device``: ``cuda`` for a ``gpu`` pool
    when this process sees CUDA, else ``cpu``."""
    if pool_device != "gpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class InProcessWorkerGroup(LocalWorkerGroup):
    """:class:`~rlweave.scheduler.local.LocalWorkerGroup` whose calls to the rank wrapper
    (``on_actor``) are answered for this process: ``placement`` gives ``pid``, ``node_ip``
    (127.0.0.1) and ``device``. :meth:`kill` drops the workers."""

    def __init__(self, name: str, worker_cls: type, contexts: Sequence["WorkerContext"]):
        super().__init__(name, worker_cls, contexts)
        self.devices = [ctx.device for ctx in contexts]

    def submit(self, method: str, ranks: Sequence[int], rank_args: Sequence, on_actor: bool = False,
               fn: Any = None, control: bool = False) -> list:  # noqa: ARG002 - calls run at once
        if not on_actor or fn is not None:
            return super().submit(method, ranks, rank_args, fn=fn)
        if method != "placement":
            return [(False, WorkerError(self.name, rank, method, f"AttributeError: no rank wrapper method {method!r} "
                                        "in process", "", None)) for rank in ranks]
        return [(True, {"pid": os.getpid(), "node_ip": "127.0.0.1", "device": self.devices[rank]}) for rank in ranks]

    def kill(self) -> None:
        self.workers = []


class InProcessRoleBuilder(BuilderInputs):
    """Builds the roles of a run in this process (see the module docstring). Same arguments as
    :class:`~rlweave.scheduler.ray_impl.build.RoleBuilder`."""

    def __init__(self, cfg: "RunConfig", records: Mapping[str, "PluginRecord"], roles: Sequence[str],
                 optimizer_total_steps: Mapping[str, int] | None = None,
                 kernel_records: Mapping[str, "PluginRecord"] | None = None) -> None:
        super().__init__(cfg, records, roles, optimizer_total_steps, kernel_records)
        self.handles: dict[str, RoleHandle] = {}
        self.lanes: dict[str, Any] = {}  # with run.in_process_threads (rlweave.scheduler.in_process_threads)

    def _check(self) -> None:
        from rlweave.config.in_process import in_process_problems

        known = [r for r in self.roles if r in self.records]
        spans = {r: spans_of(self.records[r]) for r in known}
        errors = check_placement(self.cfg, self.roles, {r: getattr(self.records[r], "parallel", None) for r in known},
                                 spans)
        errors += [(f"roles.{r}", f"no backend/engine record selected for role {r!r}") for r in self.roles
                   if r not in self.records]
        errors += in_process_problems(self.cfg, self.roles, spans)
        if errors:
            raise PlacementError(errors)

    def _role(self, role: str) -> RoleHandle:
        """``role``'s worker, built (not initialised) behind a handle."""
        section = self.cfg.roles[role]
        record = self.records[role]
        ctx = worker_context(self.cfg, role, 0, ("127.0.0.1", free_port()), self.totals.get(role), record,
                             self.kernel_records)
        ctx.device = device_of(self.cfg.resources.pools[section.pool].device)
        worker_cls = record.load()
        group = self._threaded_group(role, record, worker_cls, ctx) if self.cfg.run.in_process_threads else \
            InProcessWorkerGroup(role, worker_cls, [ctx])
        return RoleHandle(role, group, rank_parallel(section.parallel, spans_of(record)),
                          timeouts=section.timeouts.model_dump())

    def _threaded_group(self, role: str, record: "PluginRecord", worker_cls: type, ctx: "WorkerContext") -> Any:
        """``role``'s group with its calls on a lane: the training roles' shared one, or an
        engine role's own, with a control lane when its class has a control plane."""
        from rlweave.scheduler.in_process_threads import CallLane, ThreadedWorkerGroup

        def lane(name: str) -> CallLane:
            if name not in self.lanes:
                self.lanes[name] = CallLane(name)
            return self.lanes[name]

        inner = InProcessWorkerGroup(role, worker_cls, [ctx])
        if getattr(record, "kind", None) != "engine":
            return ThreadedWorkerGroup(inner, lane("train"))
        control = lane(f"{role}-control") if getattr(worker_cls, "control_plane", False) else None
        return ThreadedWorkerGroup(inner, lane(role), control)

    def build(self, init: bool = True, init_timeout_s: float | None = None) -> dict[str, RoleHandle]:
        """Build every role, then (with ``init``) initialise each; ``init_timeout_s`` is
        accepted for the Ray builder's signature and cannot apply here."""
        self._check()
        try:
            for role in self.roles:
                self.handles[role] = self._role(role)
                log.info("role %s: built in this process on %s", role, self.handles[role].group.devices[0])
            if init:
                for role, handle in self.handles.items():
                    method = init_method(self.records[role], type(handle.group.workers[0]))
                    if method is not None:
                        handle.call(method).result()
        except BaseException:
            self.close()
            raise
        return dict(self.handles)

    def rebuild(self, role: str, init: bool = True) -> RoleHandle:
        """Refused: a worker in this process cannot be replaced (``run.max_restarts`` is 0)."""
        raise RuntimeError(f"role {role!r} runs in this process (run.scheduler: in_process) and cannot be rebuilt; "
                           "use run.scheduler: ray for run.max_restarts")

    def close(self) -> None:
        """Shut every role down, in reverse order, and drop its worker (idempotent)."""
        for handle in reversed(list(self.handles.values())):
            handle.shutdown(timeout_s=5)
        self.handles = {}
        for lane in self.lanes.values():
            lane.close()
        self.lanes = {}
