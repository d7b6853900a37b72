"""Placement groups per resource pool, shared by the roles placed in them.

A pool becomes one Ray placement group with one bundle per device its slots take
(``{"GPU": 1, "CPU": c}`` for gpu pools, ``{"CPU": c}`` for cpu pools) and the pool's
strategy (PACK by default). Rank ``r`` of a role sits in bundle ``slot.offset + r``; roles of
a colocation group share their slot's bundles, each asking for ``1/len(group)`` of the GPU
(and of the CPU share), so Ray places them on the same devices.

``c`` (:data:`CPUS_PER_DEVICE`) is a small CPU share: Ray only counts CPUs, it does not pin
them, and a small share lets many ranks fit on a machine with few cores. It also makes
Ray set ``OMP_NUM_THREADS=1`` in the ranks; a worker wanting more threads sets them itself.

A rank that spans ``s`` devices (a vLLM replica with ``tp: s``; see
``EngineRecord.rank_spans``) sits in the first of its ``s`` consecutive bundles
(``slot.offset + rank * s``). Ray gives an actor the devices of one bundle only, so the
replica's devices are looked up first (:meth:`PoolPlacement.rank_devices`: one short task
per bundle, asking for the role's own share of it, reports the bundle's GPU id and node)
and the rank's process starts with all of them in ``CUDA_VISIBLE_DEVICES``, Ray told not
to overwrite it (:func:`visible_devices_env`); vLLM's worker processes inherit them. The
bundles stay one device each, so colocated roles share them as before. Every device of a
rank must be on one node: the placement check keeps a rank's bundles inside one node's
share of the pool, and :meth:`~PoolPlacement.rank_devices` raises if Ray put them on two.

When a node dies, Ray places the pool's bundles that were on it again, on nodes with room
for them (the group is ``RESCHEDULING`` meanwhile). Ray learns of the death only when the
node misses its health checks, so ranks started just after the loss may still be sent to
the dead node: :meth:`PoolPlacement.wait_placed` waits until every bundle sits on a live
node, and :meth:`PoolPlacement.dead_nodes` tells a rebuild whether its ranks were lost
with a node (then it starts them again where the bundles are now).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterable

from rlweave.config.placement import PoolLayout, Slot

CPUS_PER_DEVICE = 0.01
READY_TIMEOUT_S = 60.0
#: seconds a pool may take to place again the bundles of a lost node (Ray's health checks
#: notice a dead node after about 15 s by default, then it places the bundles again)
REPLACE_TIMEOUT_S = 120.0
#: set in a Ray worker's environment, Ray leaves its ``CUDA_VISIBLE_DEVICES`` as it is
NOSET_CUDA_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def share(n: int) -> float:
    """``1/n`` rounded down to Ray's resource precision (1e-4), so ``n`` shares fit in one."""
    return math.floor(10000 / n) / 10000


@dataclass
class PoolPlacement:
    """A pool's placement group and how many roles still use it."""

    layout: PoolLayout
    device: str
    pg: Any
    users: int = 0

    def _bundle_options(self, slot: Slot, bundle: int) -> dict[str, Any]:
        """One role's share of bundle ``bundle`` (resources and scheduling strategy)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        frac = share(len(slot.roles))
        return {
            "num_cpus": math.floor(CPUS_PER_DEVICE * frac * 10000) / 10000,  # Ray precision, sums <= bundle
            "num_gpus": frac if self.device == "gpu" else 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=bundle
            ),
        }

    def actor_options(self, slot: Slot, rank: int, env: dict[str, str] | None = None, span: int = 1) -> dict[str, Any]:
        """Ray options of rank ``rank`` of ``slot`` whose ranks span ``span`` devices each (it
        sits in bundle ``slot.offset + rank * span``); ``env``: variables its process starts with."""
        extra = {"runtime_env": {"env_vars": dict(env)}} if env else {}
        return {**extra, **self._bundle_options(slot, slot.offset + rank * span)}

    def rank_devices(self, slot: Slot, ranks: int, span: int, role: str,
                     timeout_s: float = READY_TIMEOUT_S) -> list[list[str]]:
        """GPU ids of each of ``ranks`` ranks spanning ``span`` bundles of ``slot`` (rank ``r``:
        bundles ``slot.offset + r*span ...``), found by one short task per bundle that takes the
        role's share of it. Call it before the role's actors exist (their share must be free).
        Raises ``RuntimeError`` naming the pool, role and rank when a rank's bundles are on two
        nodes, or when the bundles do not answer within ``timeout_s``."""
        import ray

        probe = ray.remote(_bundle_device)
        refs = [[probe.options(**self._bundle_options(slot, slot.offset + r * span + i)).remote() for i in range(span)]
                for r in range(ranks)]
        try:
            found = ray.get([ref for per_rank in refs for ref in per_rank], timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError and friends
            for per_rank in refs:
                for ref in per_rank:
                    ray.cancel(ref, force=True)
            raise RuntimeError(f"pool {self.layout.name!r}: the devices of role {role!r} could not be looked up "
                               f"within {timeout_s:g} s ({type(exc).__name__}: {exc})") from exc
        out = []
        for r in range(ranks):
            mine = found[r * span:(r + 1) * span]
            nodes = sorted({node for node, _ in mine})
            if len(nodes) > 1:
                raise RuntimeError(f"pool {self.layout.name!r}: rank {r} of role {role!r} spans {span} devices, but "
                                   f"Ray put them on {len(nodes)} nodes ({', '.join(nodes)}); use strategy "
                                   f"STRICT_PACK or make devices_per_node a multiple of {span}")
            out.append([gpu for _, ids in mine for gpu in ids])
        return out

    def bundle_nodes(self) -> tuple[str, dict[int, str]]:
        """The group's state (``CREATED``, ``RESCHEDULING``, ...) and bundle index -> id of the
        node Ray placed it on (empty id: not placed)."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self.pg)
        return str(table.get("state")), {int(i): str(n or "") for i, n in table.get("bundles_to_node_id", {}).items()}

    def wait_placed(self, timeout_s: float = REPLACE_TIMEOUT_S, poll_s: float = 0.2) -> dict[int, str]:
        """Bundle index -> node id once the group is placed and every bundle is on a node Ray
        reports alive. Raises ``RuntimeError`` naming the pool, the bundles left without a node
        and the cluster's resources after ``timeout_s`` (no node has room for them)."""
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            state, nodes = self.bundle_nodes()
            alive = alive_nodes()
            homeless = sorted(i for i, n in nodes.items() if n not in alive)
            if state == "CREATED" and nodes and not homeless:
                return nodes
            if time.monotonic() >= deadline:
                have = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
                raise RuntimeError(
                    f"pool {self.layout.name!r}: bundle(s) {', '.join(map(str, homeless)) or '?'} lost their node and "
                    f"Ray did not place them again within {timeout_s:g} s (placement group {state}); the live nodes "
                    f"have {have} free: add a node with the pool's devices, or give the run fewer")
            time.sleep(poll_s)

    @staticmethod
    def dead_nodes(nodes: Iterable[str]) -> list[str]:
        """The node ids of ``nodes`` that Ray reports dead (or no longer knows)."""
        alive = alive_nodes()
        return sorted({n for n in nodes if n and n not in alive})

    def release(self) -> None:
        """One role is done with the pool; the last one removes the placement group."""
        self.users -= 1
        if self.users <= 0:
            import ray
            from ray.util.placement_group import remove_placement_group

            if ray.is_initialized():
                try:
                    remove_placement_group(self.pg)
                except Exception:  # noqa: BLE001 - cluster already gone
                    pass


def alive_nodes() -> set[str]:
    """Ids of the nodes Ray reports alive."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def _bundle_device() -> tuple[str, list[str]]:
    """Inside a task in one bundle: this node's id and the bundle's GPU id(s)."""
    import ray

    return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]


def visible_devices_env(gpu_ids: list[str]) -> dict[str, str]:
    """Process environment that shows a rank exactly ``gpu_ids``: ``CUDA_VISIBLE_DEVICES``,
    and Ray told not to replace it with the one GPU of the rank's own bundle."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids), NOSET_CUDA_ENV: "1"}


def create_pool(layout: PoolLayout, device: str, strategy: str, timeout_s: float = READY_TIMEOUT_S) -> PoolPlacement:
    """Reserve the pool's bundles; raise a clear error when the cluster cannot give them."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle: dict[str, float] = {"CPU": CPUS_PER_DEVICE}
    if device == "gpu":
        bundle["GPU"] = 1
    bundles = [dict(bundle) for _ in range(layout.used)]
    pg = placement_group(bundles, strategy=strategy, name=f"rlweave-pool-{layout.name}")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - GetTimeoutError and friends
        remove_placement_group(pg)
        have = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        raise RuntimeError(
            f"pool {layout.name!r}: Ray could not reserve {layout.used} bundle(s) of {bundle} "
            f"({strategy}) within {timeout_s:g} s; the cluster has {have}"
        ) from exc
    return PoolPlacement(layout=layout, device=device, pg=pg)
