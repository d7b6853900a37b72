"""Test helpers: run a function on ``world`` ranks in fresh processes (no Ray).

``run_ranks(fn, world, *args, device="cpu")`` spawns ``world`` processes, each calling
``fn(ctx_kwargs, *args)`` where ``ctx_kwargs`` has ``rank``, ``world_size``, ``master_port``
and ``device`` ready for a :class:`rlweave.interfaces.worker.WorkerContext`. ``fn`` must be
importable (module level). Returns rank 0's return value; an exception on any rank is
re-raised in the caller with the rank named. Each rank is limited to one intra-op thread
per rank so two ranks share a 2-core machine fairly.
"""

from __future__ import annotations

import io
import os
import socket
import traceback
from typing import Any, Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world: int, port: int, device: str, threads: int, q, args) -> None:
    import torch

    torch.set_num_threads(threads)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        res = fn({"rank": rank, "world_size": world, "master_port": port, "device": device}, *args)
        buf = io.BytesIO()
        torch.save(res if rank == 0 else None, buf)  # bytes, not shared-memory handles
        q.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, False, traceback.format_exc()))
        raise


def run_ranks(fn: Callable, world: int, *args: Any, device: str = "cpu", threads: int | None = None,
              timeout_s: float = 600) -> Any:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    threads = threads or max(1, (os.cpu_count() or 2) // world)
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, fn, world, port, device, threads, q, args)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    import time

    deadline = time.time() + timeout_s
    while len(results) + len(errors) < world:
        if not q.empty():
            rank, ok, val = q.get()
            if ok:
                import torch

                results[rank] = torch.load(io.BytesIO(val), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{val}")
                break
        elif time.time() > deadline:
            errors.append(f"timeout after {timeout_s}s")
            break
        elif any(p.exitcode not in (None, 0) for p in procs) and q.empty():
            time.sleep(0.5)
            if q.empty():
                errors.append("a rank died: exit codes " + str([p.exitcode for p in procs]))
                break
        else:
            time.sleep(0.05)
    if errors:
        for p in procs:
            if p.is_alive():
                p.terminate()
    for p in procs:
        p.join(timeout=30)
    if errors:
        raise RuntimeError("run_ranks failed on " + "\n".join(errors))
    return results[0]
