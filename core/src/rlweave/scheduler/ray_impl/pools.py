"""Placement groups per resource pool, shared by the roles placed in them.

A pool becomes one Ray placement group with one bundle per device its slots take
(``{"GPU": 1, "CPU": c}`` for gpu pools, ``{"CPU": c}`` for cpu pools) and the pool's
strategy (PACK by default). Rank ``r`` of a role sits in bundle ``slot.offset + r``; roles of
a colocation group share their slot's bundles, each asking for ``1/len(group)`` of the GPU
(and of the CPU share), so Ray places them on the same devices.

``c`` (:data:`CPUS_PER_DEVICE`) is a small CPU share: Ray only counts CPUs, it does not pin
them, and a small share lets many ranks fit on a machine with few cores. It also makes
Ray set ``OMP_NUM_THREADS=1`` in the ranks; a worker wanting more threads sets them itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlweave.config.placement import PoolLayout, Slot

CPUS_PER_DEVICE = 0.01
READY_TIMEOUT_S = 60.0


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

    def actor_options(self, slot: Slot, rank: int, env: dict[str, str] | None = None) -> dict[str, Any]:
        """Ray options of rank ``rank`` of ``slot``; ``env``: variables its process starts with."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        frac = share(len(slot.roles))
        extra = {"runtime_env": {"env_vars": dict(env)}} if env else {}
        return {
            **extra,
            "num_cpus": math.floor(CPUS_PER_DEVICE * frac * 10000) / 10000,  # Ray precision, sums <= bundle
            "num_gpus": frac if self.device == "gpu" else 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=slot.offset + rank
            ),
        }

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
