"""``bench/weight_sync.py --gpu``: the cuda_ipc protocol on GPU 0, without Ray.

One source process packs a probe state (``rlweave.testing.workers.make_state_dict``, moved to the
GPU) into device buckets and shares them by CUDA IPC handle over the transport's TCPStore channel;
``dst`` receiver processes on the same GPU open, copy, verify (device checksum) and load each bucket,
acknowledging it (:func:`rlweave.weight_sync.cuda_ipc.send_buckets` / ``receive_buckets``, the code
the transport runs in its ranks). Each row: one untimed sync, then the median of ``repeats``; the
reference, measured in the same run, is one device-to-device ``copy_`` of the same number of bytes.
"""

from __future__ import annotations

import socket
import statistics
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _receiver(rank: int, port: int, dst: int, syncs: int, q) -> None:
    import torch

    from rlweave.weight_sync.cuda_ipc import open_channel, receive_buckets

    torch.cuda.set_device(0)
    store = open_channel("bench/", "127.0.0.1", port, False, 1 + dst, 600)
    loaded: dict = {}
    for n in range(1, syncs + 1):
        receive_buckets(store, n, rank, lambda items: loaded.update(items), torch.device("cuda", 0))
    q.put(("done", rank, sum(t.numel() * t.element_size() for t in loaded.values())))


def _one_size(size_mb: float, dst: int, bucket_mb: float, repeats: int) -> dict[str, float]:
    import torch
    import torch.multiprocessing as mp

    from rlweave.testing.workers import make_state_dict
    from rlweave.weight_sync.cuda_ipc import leave_end, open_channel, send_buckets

    torch.cuda.set_device(0)
    state = {n: t.cuda() for n, t in make_state_dict(size_mb, 1).items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    port, syncs = _free_port(), 1 + repeats
    store = open_channel("bench/", "127.0.0.1", port, True, 1 + dst, 600)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(r, port, dst, syncs, q)) for r in range(dst)]
    for p in procs:
        p.start()
    times = []
    try:
        for n in range(1, syncs + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            send_buckets(store, n, dst, iter(state.items()), int(bucket_mb * 2**20), torch.device("cuda", 0), 600)
            times.append(time.perf_counter() - start)
        done = [q.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
        leave_end(None, 0, "bench/")
    if any(d[2] != nbytes for d in done):
        raise RuntimeError(f"a receiver loaded {done}, expected {nbytes} bytes each")
    flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(flat)
    out.copy_(flat)
    torch.cuda.synchronize()
    copies = []
    for _ in range(repeats):
        start = time.perf_counter()
        out.copy_(flat)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - start)
    return {"mb": nbytes / 2**20, "seconds": statistics.median(times[1:]), "copy_s": statistics.median(copies)}


def main(sizes_mb: list[float], dst_ranks: list[int], bucket_mb: float, repeats: int) -> None:
    import datetime as dt

    import torch

    print(f"weight sync (cuda_ipc), {dt.date.today()}, {torch.cuda.get_device_name(0)}, bucket {bucket_mb:g} MiB, "
          f"median of {repeats}", flush=True)
    print("| state | receivers | cuda_ipc s (GiB/s) | device copy s (GiB/s) | cuda_ipc / copy |")
    print("|---|---|---|---|---|")
    for size in sizes_mb:
        for dst in dst_ranks:
            r = _one_size(size, dst, bucket_mb, repeats)
            gib = r["mb"] / 1024
            print(f"| {r['mb']:.0f} MiB | {dst} | {r['seconds']:.4f} ({gib / r['seconds']:.1f}) | {r['copy_s']:.5f} "
                  f"({gib / r['copy_s']:.1f}) | {r['seconds'] / r['copy_s']:.1f}x |", flush=True)
