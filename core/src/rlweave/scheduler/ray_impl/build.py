"""RoleBuilder / build_roles: config + selected plugin records -> running worker groups behind handles."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from rlweave.config.placement import (
    PlacementError,
    check_placement,
    devices_per_rank,
    pool_layout,
    rank_parallel,
    required_devices,
    spans_of,
)
from rlweave.scheduler import faults
from rlweave.scheduler.contexts import BuilderInputs, init_method, worker_context
from rlweave.scheduler.handle import RoleHandle
from rlweave.scheduler.ray_impl.actor import remote_actor_class
from rlweave.scheduler.ray_impl.group import RayWorkerGroup
from rlweave.scheduler.ray_impl.pools import PoolPlacement, create_pool
from rlweave.scheduler.ray_impl.process import ProcessSettings
from rlweave.scheduler.stacks import StackSource
from rlweave.scheduler.worker_log import rank_log

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RunConfig
    from rlweave.plugins.types import PluginRecord

log = logging.getLogger("rlweave.scheduler")
#: seconds to wait for a fresh actor to tell its address, and for its worker object to be built
ADDRESS_TIMEOUT_S = 120.0
SETUP_TIMEOUT_S = 300.0


def _process_settings(cfg: "RunConfig", role: str) -> ProcessSettings:
    """How the processes of ``role``'s ranks are set up (applied by the actor, not the worker)."""
    return ProcessSettings(cpu_threads=cfg.roles[role].cpu_threads, cpu_malloc_reuse=cfg.ray.cpu_malloc_reuse,
                           deterministic=cfg.run.deterministic)


class RoleBuilder(BuilderInputs):
    """Starts the ranks of a run's roles and can start one role again.

    :meth:`build` checks the placement (:class:`~rlweave.config.placement.PlacementError`
    with every problem), starts a local Ray cluster if none is connected, reserves one
    placement group per pool, creates one actor per rank, fills each rank's
    :class:`~rlweave.interfaces.worker.WorkerContext` (``options`` = the role's ``options``
    validated into the record's options model, ``model`` = the role's or the top-level model,
    ``optim`` (the validated section), ``kernels`` (the kernels selected for the role that its backend uses), ``optim_total_steps`` from ``optimizer_total_steps`` (the run's optimizer steps of that role, used where
    ``optim.total_steps`` is null), rendezvous = rank 0's node and a free port there), then,
    with ``init``, calls ``init_model()`` / ``init_engine()`` on all ranks of all roles at once.
    Each rank's process is set up first from :func:`_process_settings` (threads, allocator).
    Handles carry ``roles.<role>.timeouts``. On any failure everything started so far is shut
    down before the error propagates.

    :meth:`rebuild` ends a role's ranks (dead, hung or alive) and starts new ones in the same
    placement slots, with the same context, initialised: what recovering from a lost worker
    needs. Its placement group stays reserved meanwhile.
    """

    def __init__(self, cfg: "RunConfig", records: Mapping[str, "PluginRecord"], roles: Sequence[str],
                 optimizer_total_steps: Mapping[str, int] | None = None,
                 kernel_records: Mapping[str, "PluginRecord"] | None = None) -> None:
        super().__init__(cfg, records, roles, optimizer_total_steps, kernel_records)
        self.pools: dict[str, PoolPlacement] = {}
        self.classes: dict[str, type] = {}
        #: the run directory: each rank's output goes to ``<run_dir>/logs/<role>-<rank>.log``
        #: (None: to Ray's worker logs, shown on the console)
        self.run_dir: Path | None = None
        self.handles: dict[str, RoleHandle] = {}

    def _check(self) -> None:
        roles, records = self.roles, self.records
        known = [r for r in roles if r in records]
        errors = check_placement(self.cfg, roles, {r: getattr(records[r], "parallel", None) for r in known},
                                 {r: spans_of(records[r]) for r in known})
        errors += [(f"roles.{r}", f"no backend/engine record selected for role {r!r}") for r in roles if r not in records]
        if errors:
            raise PlacementError(errors)

    def _actors(self, role: str) -> RoleHandle:
        """New actors for every rank of ``role`` in its pool's slot (not yet set up).

        One actor per device, or, when the role's record says a rank spans ``s`` devices
        (``rank_spans``), one per ``s`` devices whose process sees all ``s`` of them
        (:mod:`rlweave.scheduler.ray_impl.pools`); the handle then dispatches over those
        ranks as data-parallel replicas."""
        from rlweave.scheduler.ray_impl.cluster import gpus_are_virtual
        from rlweave.scheduler.ray_impl.malloc import start_env
        from rlweave.scheduler.ray_impl.pools import visible_devices_env

        cfg = self.cfg
        section = cfg.roles[role]
        placement = self.pools[section.pool]
        slot = placement.layout.slot_of(role)
        if role not in self.classes:
            self.classes[role] = self.records[role].load()
        on_cpu = placement.device == "cpu" or gpus_are_virtual()
        env = start_env(cfg.ray.cpu_malloc_reuse, on_cpu)
        for name in (faults.ENV, faults.FIRED_ENV):  # test-only fault injection reaches every rank
            if os.environ.get(name):
                env[name] = os.environ[name]
        spans = spans_of(self.records[role])
        span = devices_per_rank(section.parallel, spans)
        ranks = section.devices // span
        envs = [dict(env) for _ in range(ranks)]
        if span > 1 and placement.device == "gpu":
            for rank_env, ids in zip(envs, placement.rank_devices(slot, ranks, span, role)):
                rank_env.update(visible_devices_env(ids))
        control = bool(getattr(self.classes[role], "control_plane", False))
        calls = max(1, int(getattr(self.classes[role], "concurrent_calls", 1)))
        actor_cls = remote_actor_class(control, calls)
        options = [placement.actor_options(slot, rank, envs[rank], span) for rank in range(ranks)]
        logs = [str(rank_log(self.run_dir, role, rank)) if self.run_dir is not None else None for rank in range(ranks)]
        actors = [actor_cls.options(**opts).remote(self.classes[role], role, rank, logs[rank])
                  for rank, opts in enumerate(options)]
        timeouts = section.timeouts.model_dump()
        group = RayWorkerGroup(role, actors, control=control, concurrent_calls=calls)
        group.log_files = {rank: path for rank, path in enumerate(logs) if path}
        return RoleHandle(role, group, rank_parallel(section.parallel, spans), on_close=placement.release,
                          timeouts=timeouts)

    def _setup(self, handles: Mapping[str, RoleHandle], init: bool, init_timeout_s: float | None) -> None:
        """Rendezvous, worker objects and (with ``init``) model/engine initialisation."""
        addr_futs = {
            r: h.submit_ranks("address", [0], [((), {})], lambda v: v[0], on_actor=True) for r, h in handles.items()
        }
        setup_futs = []
        for role, handle in handles.items():
            addr = tuple(addr_futs[role].result(timeout=ADDRESS_TIMEOUT_S))
            device = self.pools[self.cfg.roles[role].pool].device
            total = self.totals.get(role)
            settings = _process_settings(self.cfg, role)
            rank_args = [((worker_context(self.cfg, role, r, addr, total, self.records[role],
                                                      self.kernel_records), device, settings), {})
                         for r in range(handle.world_size)]
            setup_futs.append(handle.submit_ranks("setup", list(range(handle.world_size)), rank_args, list,
                                                  on_actor=True))
        for fut in setup_futs:
            fut.result(timeout=SETUP_TIMEOUT_S)
        for handle in handles.values():  # where each rank's stacks are read when a call hangs
            ranks = list(range(handle.world_size))
            rows = handle.submit_ranks("placement", ranks, [((), {})] * len(ranks), list, on_actor=True).result(
                timeout=ADDRESS_TIMEOUT_S)
            handle.group.stack_sources = {r: StackSource.from_dict(row) for r, row in zip(ranks, rows)}
        if init:
            futs = []
            for role, handle in handles.items():
                method = init_method(self.records[role], self.classes[role])
                if method is not None:
                    futs.append(handle.call(method))
            for fut in futs:
                fut.result(timeout=init_timeout_s)

    def build(self, init: bool = True, init_timeout_s: float | None = None) -> dict[str, RoleHandle]:
        """Start every role (see the class docstring); ``init_timeout_s`` overrides the
        roles' ``timeouts.init``."""
        import ray

        from rlweave.scheduler.ray_impl.cluster import start_ray

        self._check()
        if not ray.is_initialized():
            start_ray(self.cfg.ray, required_devices(self.cfg, self.roles))
        try:
            for name, layout in pool_layout(self.cfg, self.roles).items():
                pool = self.cfg.resources.pools[name]
                self.pools[name] = create_pool(layout, pool.device, pool.strategy)
            for role in self.roles:
                self.handles[role] = self._actors(role)
                self.pools[self.cfg.roles[role].pool].users += 1
            self._setup(self.handles, init, init_timeout_s)
        except BaseException:
            self.close()
            raise
        return dict(self.handles)

    def rebuild(self, role: str, init: bool = True) -> RoleHandle:
        """End ``role``'s ranks at once and start new, initialised ones in their place.

        The new ranks start once every bundle of the role's pool sits on a live node
        (:meth:`~rlweave.scheduler.ray_impl.pools.PoolPlacement.wait_placed`: after a node
        loss Ray places its bundles again elsewhere). Ray may not know yet that a node died,
        and send new ranks there; when they are lost and a node of the pool is then reported
        dead, they are started again once Ray has placed the bundles anew (so at most once per
        lost node). Any other failure propagates."""
        from rlweave.worker_errors import WorkerError

        old = self.handles[role]
        old.kill(release=False)
        log.warning("rebuilding role %s (%d rank(s))", role, old.world_size)
        placement = self.pools[self.cfg.roles[role].pool]
        while True:
            nodes = placement.wait_placed()
            handle = self._actors(role)
            self.handles[role] = handle
            try:
                self._setup({role: handle}, init, None)
                return handle
            except BaseException as exc:
                handle.kill(release=False)
                dead = placement.dead_nodes(nodes.values()) if isinstance(exc, WorkerError) and exc.lost else []
                if not dead:
                    raise
                log.warning("rebuilding role %s: its new ranks were lost with node(s) %s; starting them again where "
                            "Ray places the pool's bundles now", role, ", ".join(dead))

    def close(self) -> None:
        """Shut every role down and give back every placement group (idempotent)."""
        for handle in self.handles.values():
            handle.shutdown(timeout_s=5)
        for placement in self.pools.values():  # removing a removed group again is harmless
            placement.users = 1
            placement.release()
        self.handles = {}
        self.pools = {}


def build_roles(
    cfg: "RunConfig",
    records: Mapping[str, "PluginRecord"],
    roles: Sequence[str],
    init: bool = True,
    init_timeout_s: float | None = None,
    optimizer_total_steps: Mapping[str, int] | None = None,
) -> dict[str, RoleHandle]:
    """Start every rank of ``roles`` and return their handles (see :class:`RoleBuilder`;
    shutting each handle down gives its devices back)."""
    return RoleBuilder(cfg, records, roles, optimizer_total_steps).build(init, init_timeout_s)
