"""Release the OpenMP worker threads of a thread that computed for one call.

GNU OpenMP (the runtime PyTorch's Linux builds use for intra-op threads) gives every thread
that starts a parallel region a pool of worker threads of its own, kept until that thread
exits. Once a process holds more of them than it has CPUs, GNU OpenMP lets each worker spin
only briefly before it sleeps in the kernel, so every parallel region afterwards pays a
wake-up, in every pool of the process: small torch ops ran several times slower (the numbers
are in bench/RESULTS.md, "OpenMP pools"). A process whose calls run on several long-lived
threads (a Ray actor with concurrency groups: an engine's control channel, concurrent
generate calls) would keep one pool for each thread that ever computed.

:func:`release_thread_pool` frees the calling thread's pool (``omp_pause_resource_all``,
which GNU OpenMP implements for the calling thread's pool alone); the thread's next parallel
region starts its workers again. :func:`release_off_main` does so on any thread but the main
one (at the end of a call run on a thread of a pool), :func:`releasing` wraps a function
submitted to a thread pool. Other OpenMP runtimes (LLVM's, Intel's) pause every thread's
pool with that call, so nothing is done where the loaded runtime is not GNU OpenMP.

Importing this module imports no torch, and :func:`release_thread_pool` loads no OpenMP
runtime: it only looks for one already in the process.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: a loaded GNU OpenMP runtime, by its file name (PyTorch wheels carry ``libgomp.so.1`` or
#: ``libgomp-<hash>.so.1``)
_GOMP = re.compile(r"/libgomp[^/]*\.so[^/]*$")
_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: omp_pause_soft

_pause: Callable[[int], int] | None = None
_looked = False  # looked with torch loaded: the answer is final


def _find_pause() -> Callable[[int], int] | None:
    """``omp_pause_resource_all`` of the GNU OpenMP runtime loaded in this process, or None
    (none loaded yet, or another runtime). Looks once torch is imported; before, every call
    looks again (cheaply: no torch, no runtime)."""
    global _pause, _looked
    if _looked:
        return _pause
    if "torch" not in sys.modules:
        return None
    _looked = True
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if ".so" in line}
    except OSError:  # no /proc (not Linux)
        return None
    found = sorted(p for p in paths if _GOMP.search(p))
    if not found:
        return None
    try:
        fn: Any = ctypes.CDLL(found[0]).omp_pause_resource_all  # already loaded: the same library
    except (OSError, AttributeError):  # a GNU OpenMP before OpenMP 5.0
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    _pause = fn
    return _pause


def release_thread_pool() -> bool:
    """Free the OpenMP worker threads the calling thread started, if it started any; must not
    be called inside a parallel region. Returns whether GNU OpenMP took the call (False where
    no GNU OpenMP runtime is loaded)."""
    pause = _find_pause()
    return pause is not None and pause(_OMP_PAUSE_SOFT) == 0


def release_off_main() -> None:
    """:func:`release_thread_pool` unless the caller is the main thread, which keeps its pool:
    for the end of a call run on a thread of a pool (the main thread of a process whose calls
    all run there, one at a time, holds the only pool)."""
    if threading.current_thread() is not threading.main_thread():
        release_thread_pool()


def releasing(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` followed by :func:`release_off_main`, whether it returns or raises: the form to
    submit to a thread pool whose threads may run torch ops."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            release_off_main()

    return run
