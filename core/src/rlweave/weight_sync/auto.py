"""Where a role's ranks run (:func:`locate_end`, :func:`locate`) and what
``weight_sync.transport: auto`` picks from that (:func:`pick_transport`, a pure function).

``auto``:

* every destination rank in the source rank 0's process (``run.scheduler: in_process``):
  ``in_process``;
* both roles on CUDA, every destination rank on the source rank 0's node (the same Ray node,
  :func:`same_node`) and seeing its GPU (colocated roles): ``cuda_ipc``;
* both roles on CUDA otherwise: ``broadcast`` (an NCCL group);
* anything else (CPU ranks, a CPU role feeding a GPU role, ranks that cannot be located):
  ``object_store``. On CPU the object store measured faster than the gloo broadcast for
  large states and for more than one receiver (bench/RESULTS.md, "Weight sync
  transports"): its buckets sit in shared memory every receiver maps.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle


def node_key() -> str:
    """This machine: host name and boot id (processes with the same key can share memory)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def locate_end(worker: Any, rank: int) -> dict[str, Any]:  # noqa: ARG001
    """Rank side: ``node`` (:func:`node_key`), ``node_ip`` and ``ray_node`` (Ray's address and
    node id, when inside Ray), ``pid``, ``device`` (the worker's ``ctx.device``), ``gpu`` (UUID of
    its current CUDA device, or None) and ``visible`` (UUIDs of the CUDA devices it sees)."""
    device = getattr(getattr(worker, "ctx", None), "device", "cpu") or "cpu"
    out: dict[str, Any] = {"node": node_key(), "node_ip": None, "ray_node": None, "pid": os.getpid(),
                           "device": device, "gpu": None, "visible": []}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        out["node_ip"] = ray.util.get_node_ip_address()
        out["ray_node"] = ray.get_runtime_context().get_node_id()
    if device == "cuda":
        import torch

        from rlweave.weight_sync.handles import device_uuid, visible_uuids

        out["gpu"] = device_uuid(torch.cuda.current_device())
        out["visible"] = visible_uuids()
    return out


def locate(handle: "RoleHandle", ranks: Sequence[int], timeout_s: float) -> list[dict[str, Any]]:
    """:func:`locate_end` of ``ranks`` of a role (a generic call named ``locate_ranks``),
    within ``timeout_s``."""
    ranks = list(ranks)
    return handle.submit_ranks("locate_ranks", ranks, [((), {})] * len(ranks), list,
                               fn=locate_end).result(timeout=timeout_s)


def same_node(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two :func:`locate_end` records are on one node: the same Ray node when both
    know theirs (Ray nodes that share a machine, such as several raylets of one host or
    containers with the host's name, are still separate nodes to placement, and containers do
    not share memory), else the same machine (:func:`node_key`)."""
    if a.get("ray_node") and b.get("ray_node"):
        return a["ray_node"] == b["ray_node"] and a["node"] == b["node"]
    return a["node"] == b["node"]


def where(rec: Mapping[str, Any]) -> str:
    """A :func:`locate_end` record's node for a message: address and Ray node id, or machine."""
    if rec.get("ray_node"):
        return f"{rec.get('node_ip') or rec['node']} (Ray node {rec['ray_node'][:12]})"
    return str(rec.get("node_ip") or rec["node"])


def colocation_problem(src: Mapping[str, Any], dst: Sequence[Mapping[str, Any]], src_name: str = "source",
                       dst_name: str = "destination") -> str | None:
    """Why memory handles of source rank 0 (``src``, a :func:`locate_end` record) cannot be
    opened by every destination rank (``dst``), or None when they can."""
    for r, d in enumerate(dst):
        if not same_node(d, src):
            return (f"{dst_name!r} rank {r} runs on node {where(d)}, {src_name!r} rank 0 on {where(src)}: "
                    "cuda_ipc needs both roles on one node")
        if d["device"] != src["device"]:
            return (f"{src_name!r} rank 0 is on {src['device']}, {dst_name!r} rank {r} on {d['device']}: cuda_ipc "
                    "needs both roles on the same kind of device")
        if src["device"] == "cuda" and src["gpu"] not in d["visible"]:
            return (f"{dst_name!r} rank {r} does not see {src_name!r} rank 0's GPU {src['gpu']} (it sees "
                    f"{', '.join(d['visible']) or 'none'}): cuda_ipc needs the roles colocated on that GPU")
    return None


def pick_transport(src: Mapping[str, Any] | None, dst: Sequence[Mapping[str, Any]] | None) -> str:
    """The transport ``auto`` means for source rank 0 at ``src`` and destination ranks at
    ``dst`` (:func:`locate_end` records; None: could not be located). See the module docstring."""
    if src is None or not dst:
        return "object_store"
    if all(d["node"] == src["node"] and d["pid"] == src["pid"] for d in dst):
        return "in_process"
    if src["device"] != "cuda" or any(d["device"] != "cuda" for d in dst):
        return "object_store"
    return "cuda_ipc" if colocation_problem(src, dst) is None else "broadcast"


def resolve_auto(src: "RoleHandle", dst: "RoleHandle", timeout_s: float) -> str:
    """:func:`pick_transport` for two running roles (asks their ranks where they are)."""
    from rlweave.worker_errors import WorkerError, WorkerTimeout

    try:
        here = locate(src, [0], timeout_s)[0]
        there = locate(dst, range(dst.world_size), timeout_s)
    except (WorkerError, WorkerTimeout):
        return "object_store"
    return pick_transport(here, there)
