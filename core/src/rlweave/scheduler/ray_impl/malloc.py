"""Keep freed memory in CPU processes for reuse (glibc malloc thresholds).

By default glibc gives a large freed block back to the OS (``munmap`` above a dynamic
threshold of 128 KiB to 32 MiB, heap trimming above 128 KiB free at the top), so the next
tensor of that size is mapped again and every 4 KiB page is zero-filled on first touch. A
CPU training step allocates and frees gigabytes of activations and gradients, so each train
step faults them back in. With both thresholds raised freed blocks stay in the heap and are
reused, as CUDA caching allocators keep device memory: no faults after the first step, and a
faster step (``bench/grpo_vs_trl.py``; the numbers are in bench/RESULTS.md).

Where it applies (``ray.cpu_malloc_reuse``, on by default):

* a local cluster on a GPU-less machine (every rank runs on CPU): the controller calls
  :func:`cpu_malloc` before starting Ray, so it and every Ray process (GCS, raylet, the
  ranks, the processes they start) run with the settings from their start
  (``GLIBC_TUNABLES``);
* a rank of a ``cpu`` pool elsewhere starts with the variable (:func:`start_env`);
* a rank on a CPU device also calls :func:`keep_freed_memory` while it sets up (ranks the
  controller could not classify).

Cost: a process keeps its heap's high-water mark until it exits (what it frees, it reuses
itself). ``ray.cpu_malloc_reuse: false`` keeps glibc's defaults; a ``GLIBC_TUNABLES`` the
user set is left as it is.
"""

from __future__ import annotations

import ctypes
import os
import platform

#: the same settings for processes a rank starts (an engine's workers), read by glibc at exec
TUNABLES = "glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=2147483647"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_INT_MAX = 2**31 - 1


_exported = False  # GLIBC_TUNABLES in os.environ was set by keep_freed_memory


def cpu_malloc(reuse: bool) -> None:
    """Before a local cluster starts: keep freed memory in this process and export the
    settings to the processes it starts (``reuse``), or stop exporting settings this module
    exported earlier (a later cluster in the same process, with reuse off)."""
    global _exported
    if reuse:
        keep_freed_memory()
    elif _exported:
        os.environ.pop("GLIBC_TUNABLES", None)
        _exported = False


def start_env(reuse: bool, on_cpu: bool) -> dict[str, str]:
    """Environment a rank process should start with: ``GLIBC_TUNABLES`` when it keeps freed
    memory (``reuse``) on a CPU device and the controller's environment does not set it."""
    if reuse and on_cpu and "GLIBC_TUNABLES" not in os.environ:
        return {"GLIBC_TUNABLES": TUNABLES}
    return {}


def keep_freed_memory() -> bool:
    """Raise this process's mmap and trim thresholds (``mallopt``) and export
    ``GLIBC_TUNABLES`` for its subprocesses, unless the variable is already set (a user's
    choice wins). Returns False, changing nothing, where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, _INT_MAX) != 1 or mallopt(_M_TRIM_THRESHOLD, _INT_MAX) != 1:
        return False
    global _exported
    if "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = TUNABLES
        _exported = True
    return True


def realloc_page_faults(nbytes: int = 64 << 20) -> int:
    """Minor page faults of writing a fresh ``nbytes // 2`` buffer right after freeing one
    of ``nbytes``: about ``nbytes / 8192`` when freed memory goes back to the OS, about 0
    when it is kept (a probe for tests and diagnostics). Half the size, because an
    aligned allocation of exactly the freed size may not fit the freed block."""
    import resource

    import torch

    torch.ones(nbytes // 4, dtype=torch.float32)  # allocated, touched, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(nbytes // 8, dtype=torch.float32)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
