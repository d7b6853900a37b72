"""Run a function on ``world`` ranks in fresh processes (no Ray): the launcher of the
multi-rank backend scenarios (:mod:`rlweave.testing.scenarios`).

``run_ranks(fn, world, *args, device="cpu")`` spawns ``world`` processes, each calling
``fn(ctx_kwargs, *args)`` where ``ctx_kwargs`` has ``rank``, ``world_size``, ``master_port``
and ``device`` ready for a :class:`rlweave.interfaces.worker.WorkerContext`. ``fn`` must be a
module-level function of an importable module or of a test helper loaded with
:func:`rlweave.testing.helper_modules.import_helper` (each rank loads that file again);
``args`` must unpickle without it (plain data). Returns rank 0's return value; an exception on
any rank is re-raised in the caller with the rank named. Each rank is limited to one intra-op
thread per rank so two ranks share a 2-core machine fairly.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import traceback
from typing import Any, Callable

from rlweave.plugins.types import import_target
from rlweave.testing.helper_modules import HELPER_FILE, import_helper


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def function_ref(fn: Callable) -> tuple[str, str, str | None]:
    """``(module name, qualified name, helper file or None)`` of the module-level ``fn``."""
    module = sys.modules.get(fn.__module__)
    return fn.__module__, fn.__qualname__, getattr(module, HELPER_FILE, None)


def resolve_ref(ref: tuple[str, str, str | None]) -> Callable:
    """The function :func:`function_ref` described, imported (or its helper file loaded) here."""
    name, qualname, helper = ref
    if helper:
        import_helper(helper, name)  # registered under ``name``, where the import finds it
    return import_target(f"{name}:{qualname}")


def _entry(rank: int, ref: tuple, world: int, port: int, device: str, threads: int, q, args) -> None:
    import torch

    torch.set_num_threads(threads)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        fn = resolve_ref(ref)
        res = fn({"rank": rank, "world_size": world, "master_port": port, "device": device}, *args)
        buf = io.BytesIO()
        torch.save(res if rank == 0 else None, buf)  # bytes, not shared-memory handles
        q.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, False, traceback.format_exc()))
        raise


PORT_TAKEN = "Address already in use"
PORT_TRIES = 3


def run_ranks(fn: Callable, world: int, *args: Any, device: str = "cpu", threads: int | None = None,
              timeout_s: float = 600) -> Any:
    """Rank 0's result of ``fn(ctx_kwargs, *args)`` on ``world`` spawned ranks (see the module
    docstring); ``threads`` intra-op threads per rank (default: the cores shared evenly). A rank
    that raises or dies, or no result within ``timeout_s``, stops the others and raises
    ``RuntimeError`` naming the rank and its traceback. Every rank is joined before this returns;
    one still running 30 s after the results came (stuck in its interpreter's teardown) is killed.
    Where the rendezvous port, free when it was chosen, was taken by another process before
    rank 0 bound it (``Address already in use``), the ranks start again on another port, up to
    ``PORT_TRIES`` times."""
    for _ in range(PORT_TRIES - 1):
        try:
            return _run_ranks_once(fn, world, args, device, threads, timeout_s)
        except RuntimeError as e:
            if PORT_TAKEN not in str(e):
                raise
    return _run_ranks_once(fn, world, args, device, threads, timeout_s)


def _run_ranks_once(fn: Callable, world: int, args: tuple, device: str, threads: int | None,
                    timeout_s: float) -> Any:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    threads = threads or max(1, (os.cpu_count() or 2) // world)
    port = free_port()
    ref = function_ref(fn)
    procs = [ctx.Process(target=_entry, args=(r, ref, world, port, device, threads, q, args)) for r in range(world)]
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
        if p.is_alive():  # stuck in its interpreter's teardown; every result is already here
            p.kill()
            p.join(timeout=30)
    if errors:
        raise RuntimeError("run_ranks failed on " + "\n".join(errors))
    return results[0]
