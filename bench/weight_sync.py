"""Weight sync transports side by side: object store, broadcast (gloo) and cuda_ipc (CPU shared
memory), on one Ray cluster; ``--gpu``: the cuda_ipc protocol on one GPU, without Ray.

A ``policy`` role of probe workers holds a state dict the size of a model's fp32 weights
(``rlweave.testing.workers.ProbeWorker``, mixed fp32/bf16/fp16 tensors) and syncs it into a
``rollout`` role of probe engines with 1 or 2 ranks, through each transport in turn, with the
transports built and set up once (as a run does) and the same bucket size. Each row: one
untimed sync, then the median of ``--repeats`` timed syncs; MB/s is payload bytes over wall
time of the whole sync, in MiB/s (every destination rank has verified and loaded every bucket).

    .venv/bin/python bench/weight_sync.py                     # 35M- and 200M-parameter-sized states
    .venv/bin/python bench/weight_sync.py --sizes-mb 210 --repeats 5
    python bench/weight_sync.py --gpu                          # a GPU machine (no Ray needed)

``--gpu`` (see :mod:`weight_sync_gpu`): one source process and ``--dst-ranks`` receiver processes
(torch.multiprocessing) on GPU 0 run the cuda_ipc protocol (device buckets, CUDA IPC handles,
device checksum, a device copy on each receiver) over its TCPStore channel; the reference, measured
in the same run, is the GPU's device-to-device copy bandwidth (one ``copy_`` of the same bytes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

TRANSPORTS = ("object_store", "broadcast", "cuda_ipc")


def measure(size_mb: float, dst_ranks: int, bucket_mb: float, repeats: int) -> dict[str, dict[str, float]]:
    from rlweave.config.schema import RaySection, RunConfig
    from rlweave.plugins.types import BackendRecord, EngineRecord
    from rlweave.scheduler import build_roles, shutdown_ray, start_ray
    from rlweave.weight_sync import WeightSync
    from rlweave.weight_sync.section import WeightSyncSection

    probe = BackendRecord(name="probe", summary="bench", target="rlweave.testing.workers:ProbeWorker")
    engine = EngineRecord(name="probe-engine", summary="bench", target="rlweave.testing.workers:ProbeEngine")
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 1 + dst_ranks}}},
        "roles": {"policy": {"pool": "main", "devices": 1, "options": {"weights_mb": size_mb, "weights_seed": 1}},
                  "rollout": {"pool": "main", "devices": dst_ranks}},
    })
    start_ray(RaySection(num_cpus=os.cpu_count() or 2, virtual_gpus=1 + dst_ranks))
    roles = build_roles(cfg, {"policy": probe, "rollout": engine}, ["policy", "rollout"])
    out = {}
    try:
        for name in TRANSPORTS:
            ws = WeightSync(roles, WeightSyncSection(transport=name, bucket_mb=bucket_mb, timeout_s=600))
            try:
                ws.sync("policy", "rollout")  # untimed: setup and first-touch costs
                runs = [ws.sync("policy", "rollout") for _ in range(repeats)]
            finally:
                ws.close()
            seconds = statistics.median(r["seconds"] for r in runs)
            out[name] = {"seconds": seconds, "mb": runs[0]["bytes"] / 2**20, "mb_s": runs[0]["bytes"] / 2**20 / seconds}
    finally:
        for h in roles.values():
            h.shutdown()
        shutdown_ray()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[210.0, 1144.0],
                    help="ProbeWorker weights_mb (its dtype mix sends 2/3 of it: 210 -> 140 MiB, the 35M-parameter "
                    "yardstick's 134 MiB in fp32, about; 1144 -> 763 MiB, 200M parameters)")
    ap.add_argument("--dst-ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu", action="store_true", help="the cuda_ipc protocol on GPU 0 (no Ray); see above")
    a = ap.parse_args()
    if a.gpu:
        from weight_sync_gpu import main as gpu_main

        gpu_main(a.sizes_mb, a.dst_ranks, a.bucket_mb, a.repeats)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    print(f"weight sync, {dt.date.today()}, {cpu_name()}, {os.cpu_count()} cores, bucket {a.bucket_mb:g} MiB, "
          f"median of {a.repeats}", flush=True)
    print("| state | destination ranks | object store s (MiB/s) | broadcast s (MiB/s) | cuda_ipc (shared memory) s "
          "(MiB/s) | object store / broadcast | object store / cuda_ipc |")
    print("|---|---|---|---|---|---|---|")
    for size in a.sizes_mb:
        for dst in a.dst_ranks:
            r = measure(size, dst, a.bucket_mb, a.repeats)
            o, b, c = r["object_store"], r["broadcast"], r["cuda_ipc"]
            print(f"| {o['mb']:.0f} MiB | {dst} | {o['seconds']:.3f} ({o['mb_s']:.0f}) | {b['seconds']:.3f} "
                  f"({b['mb_s']:.0f}) | {c['seconds']:.3f} ({c['mb_s']:.0f}) | {o['seconds'] / b['seconds']:.2f}x | "
                  f"{o['seconds'] / c['seconds']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
