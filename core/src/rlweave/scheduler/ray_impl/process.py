"""How a rank's process is set up before its worker is built (CPU threads, memory allocator).

These are settings of the process that hosts a worker, not of the worker: the role builder
(:mod:`.build`) takes them from the config (``roles.<role>.cpu_threads``,
``ray.cpu_malloc_reuse``) and the actor (:meth:`.actor.WorkerActor.setup`) applies them on a CPU
device before it builds the worker. Workers see their effect (``torch.get_num_threads()``), not
the settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlweave.scheduler.ray_impl.malloc import keep_freed_memory


@dataclass(frozen=True)
class ProcessSettings:
    """``cpu_threads``: intra-op threads of a rank on a CPU device (None: the node's cores
    divided by the role's ranks); ``cpu_malloc_reuse``: keep freed memory in the process for
    reuse (:mod:`.malloc`). After :func:`apply`, the values applied (``cpu_threads`` None and
    ``cpu_malloc_reuse`` False where nothing was); ``deterministic``: torch's deterministic
    algorithms on (``run.deterministic``), on every device."""

    cpu_threads: int | None = None
    cpu_malloc_reuse: bool = True
    deterministic: bool = False


def use_deterministic_algorithms() -> None:
    """Make this process's torch kernels deterministic: ``torch.use_deterministic_algorithms``
    (an op without a deterministic kernel raises, naming itself) and, for cuBLAS, a fixed
    workspace (``CUBLAS_WORKSPACE_CONFIG``, read when CUDA starts)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def cpu_threads(requested: int | None, world_size: int) -> int:
    """Intra-op threads of a CPU rank: ``requested``, else the node's cores divided by the
    role's ranks (its ranks run at the same time; different roles mostly take turns)."""
    if requested:
        return int(requested)
    return max(1, (os.cpu_count() or 1) // max(1, world_size))


def apply_cpu_threads(n: int) -> None:
    """Give this process ``n`` intra-op threads. Ray starts a rank with ``OMP_NUM_THREADS=1``
    (its CPU share is tiny); the variable is reset too, so subprocesses (an engine's) inherit it."""
    import torch

    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def apply(settings: ProcessSettings, device: str, world_size: int) -> ProcessSettings:
    """Apply ``settings`` to this process for a rank of a ``world_size``-rank role on ``device``
    (``"cpu"`` or ``"cuda"``; on CUDA only ``deterministic``). Returns what was applied."""
    if settings.deterministic:
        use_deterministic_algorithms()
    if device != "cpu":
        return ProcessSettings(cpu_threads=None, cpu_malloc_reuse=False, deterministic=settings.deterministic)
    n = cpu_threads(settings.cpu_threads, world_size)
    apply_cpu_threads(n)
    return ProcessSettings(cpu_threads=n, cpu_malloc_reuse=bool(settings.cpu_malloc_reuse) and keep_freed_memory(),
                           deterministic=settings.deterministic)
