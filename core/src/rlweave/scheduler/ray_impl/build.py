"""build_roles: config + selected plugin records -> running worker groups behind handles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rlweave.config.placement import PlacementError, check_placement, pool_layout, required_devices
from rlweave.interfaces.worker import WorkerContext
from rlweave.scheduler.handle import RoleHandle
from rlweave.scheduler.ray_impl.actor import remote_actor_class
from rlweave.scheduler.ray_impl.group import RayWorkerGroup
from rlweave.scheduler.ray_impl.pools import PoolPlacement, create_pool

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RunConfig
    from rlweave.plugins.types import PluginRecord


def init_method(record: Any, worker_cls: type) -> str | None:
    """``init_engine`` for engines, ``init_model`` for backends (or whichever the class has)."""
    kind = getattr(record, "kind", None)
    if kind == "engine":
        return "init_engine"
    if kind == "backend":
        return "init_model"
    for name in ("init_model", "init_engine"):
        if hasattr(worker_cls, name):
            return name
    return None


def _context(cfg: "RunConfig", role: str, rank: int, addr: tuple[str, int],
             total_steps: int | None = None) -> WorkerContext:
    section = cfg.roles[role]
    extra: dict = {"optim": section.optim.model_dump() if section.optim is not None else None}
    if total_steps:
        extra["total_steps"] = int(total_steps)
    model = section.model if section.model is not None else cfg.model
    return WorkerContext(
        role=role,
        rank=rank,
        world_size=section.devices,
        master_addr=addr[0],
        master_port=addr[1],
        config=dict(section.options),
        model=model.model_dump(),
        seed=cfg.run.seed,
        parallel=dict(section.parallel),
        extra=extra,
        cpu_threads=section.cpu_threads,
        cpu_malloc_reuse=cfg.ray.cpu_malloc_reuse,
    )


def build_roles(
    cfg: "RunConfig",
    records: Mapping[str, "PluginRecord"],
    roles: Sequence[str],
    init: bool = True,
    init_timeout_s: float | None = None,
    optimizer_total_steps: Mapping[str, int] | None = None,
) -> dict[str, RoleHandle]:
    """Start every rank of ``roles`` and return their handles.

    Checks the placement (:class:`~rlweave.config.placement.PlacementError` with every
    problem), starts a local Ray cluster if none is connected, reserves one placement
    group per pool, creates one actor per rank, fills each rank's
    :class:`~rlweave.interfaces.worker.WorkerContext` (``config`` = the role's ``options``,
    ``model`` = the role's or the top-level model, ``extra['optim']``, ``extra['total_steps']``
    from ``optimizer_total_steps`` (the run's optimizer steps of that role, used where
    ``optim.total_steps`` is null), rendezvous = rank 0's
    node and a free port there), then, with ``init``, calls ``init_model()`` /
    ``init_engine()`` on all ranks of all roles at once. On any failure everything started
    so far is shut down before the error propagates.
    """
    import ray

    from rlweave.scheduler.ray_impl.cluster import gpus_are_virtual, start_ray
    from rlweave.scheduler.ray_impl.malloc import start_env

    roles = list(dict.fromkeys(roles))
    errors = check_placement(cfg, roles, {r: getattr(records[r], "parallel", None) for r in roles if r in records})
    missing = [r for r in roles if r not in records]
    errors += [(f"roles.{r}", f"no backend/engine record selected for role {r!r}") for r in missing]
    if errors:
        raise PlacementError(errors)
    if not ray.is_initialized():
        start_ray(cfg.ray, required_devices(cfg, roles))

    pools: dict[str, PoolPlacement] = {}
    handles: dict[str, RoleHandle] = {}
    try:
        for name, layout in pool_layout(cfg, roles).items():
            pool = cfg.resources.pools[name]
            pools[name] = create_pool(layout, pool.device, pool.strategy)

        actor_cls = remote_actor_class()
        classes: dict[str, type] = {}
        for role in roles:
            placement = pools[cfg.roles[role].pool]
            slot = placement.layout.slot_of(role)
            classes[role] = records[role].load()
            on_cpu = placement.device == "cpu" or gpus_are_virtual()
            env = start_env(cfg.ray.cpu_malloc_reuse, on_cpu)
            actors = [
                actor_cls.options(**placement.actor_options(slot, rank, env)).remote(classes[role], role, rank)
                for rank in range(cfg.roles[role].devices)
            ]
            placement.users += 1
            handles[role] = RoleHandle(role, RayWorkerGroup(role, actors), cfg.roles[role].parallel,
                                       on_close=placement.release)

        # rendezvous: rank 0's node and a free port there, one per role
        addr_futs = {
            r: h.submit_ranks("address", [0], [((), {})], lambda v: v[0], on_actor=True) for r, h in handles.items()
        }
        setup_futs = []
        for role, handle in handles.items():
            addr = tuple(addr_futs[role].result(timeout=120))
            device = pools[cfg.roles[role].pool].device
            total = (optimizer_total_steps or {}).get(role)
            rank_args = [((_context(cfg, role, r, addr, total), device), {}) for r in range(handle.world_size)]
            ranks = list(range(handle.world_size))
            setup_futs.append(handle.submit_ranks("setup", ranks, rank_args, list, on_actor=True))
        for fut in setup_futs:
            fut.result(timeout=300)

        if init:
            futs = []
            for role, handle in handles.items():
                method = init_method(records[role], classes[role])
                if method is not None:
                    futs.append(handle.call(method))
            for fut in futs:
                fut.result(timeout=init_timeout_s)
    except BaseException:
        for handle in handles.values():
            handle.shutdown(timeout_s=5)
        for placement in pools.values():
            if placement.users <= 0:
                placement.users = 1
                placement.release()
        raise
    return handles
