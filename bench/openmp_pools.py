"""Small torch ops on a second long-lived thread, with and without its OpenMP pool released.

GNU OpenMP keeps one pool of worker threads per thread that ran a parallel region; once a
process holds more pool threads than CPUs, every parallel region in it pays a kernel wake-up
(``rlweave.devices.openmp``). This bench reproduces the case of a Ray rank whose calls run on
the threads of concurrency groups: a "compute" thread runs many small ops (the shape of a tiny
model's decoding step) after a "control" thread ran one parallel op, with the control thread's
pool kept (as before ``release_thread_pool``) and released (as a rank call now ends). Rows:
seconds for ``--reps`` iterations of each op, median of ``--repeat`` runs, all in one process.

    python bench/openmp_pools.py
    python bench/openmp_pools.py --threads 4 --reps 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core" / "src"))


class Thread:
    """A long-lived thread that runs the functions handed to it (as a concurrency group's)."""

    def __init__(self, name: str):
        self._jobs: queue.Queue = queue.Queue()
        self._out: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._out.put(self._jobs.get()())

    def run(self, fn: Callable[[], Any]) -> Any:
        self._jobs.put(fn)
        return self._out.get()


def ops(reps: int) -> dict[str, float]:
    """Seconds for ``reps`` small matmuls and ``reps`` small elementwise ops on this thread."""
    import torch

    x, w = torch.randn(256, 64), torch.randn(64, 64)
    t = time.perf_counter()
    for _ in range(reps):
        x @ w
    mm = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(reps):
        torch.nn.functional.silu(x) + x
    return {"matmul 256x64 @ 64x64": mm, "silu + add 256x64": time.perf_counter() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="intra-op threads (default: cores)")
    ap.add_argument("--reps", type=int, default=3000, help="iterations of each op per run")
    ap.add_argument("--repeat", type=int, default=5, help="runs per row (median)")
    a = ap.parse_args()

    import torch

    from rlweave.devices.openmp import release_thread_pool

    torch.set_num_threads(a.threads)
    compute, control = Thread("compute"), Thread("control")
    big = control.run(lambda: torch.ones(1 << 22))
    control.run(release_thread_pool)
    release_thread_pool()  # the main thread computes nothing here: only the two threads' pools count

    def control_op(release: bool) -> None:
        big.add_(1)  # a parallel region on the control thread: a pool of its own
        if release:
            release_thread_pool()

    rows: dict[str, dict[str, list[float]]] = {}
    cases = [("compute thread alone", None), ("control thread's pool kept", False),
             ("control thread's pool released", True)]
    for _ in range(a.repeat):
        for name, release in cases:  # the cases take turns, so drift spreads over all of them
            if release is not None:
                control.run(lambda r=release: control_op(r))
            for op, s in compute.run(lambda: ops(a.reps)).items():
                rows.setdefault(op, {}).setdefault(name, []).append(s)
            control.run(release_thread_pool)  # back to one pool before the next case
    print(f"{a.reps} iterations per op, median of {a.repeat} runs, {a.threads} intra-op threads, "
          f"{os.cpu_count()} CPU cores, torch {torch.__version__}\n")
    names = [n for n, _ in cases]
    print("| op | " + " | ".join(names) + " | kept / released |")
    print("|---|" + "---:|" * (len(names) + 1))
    for op, by in rows.items():
        med = {n: statistics.median(by[n]) for n in names}
        print(f"| {op} | " + " | ".join(f"{med[n]:.3f} s" for n in names)
              + f" | {med[names[1]] / med[names[2]]:.1f}x |")


if __name__ == "__main__":
    main()
