"""rlweave.devices.openmp: a thread frees the OpenMP workers it started, and the helper does
nothing (and imports nothing) where no GNU OpenMP runtime is loaded. Each case runs in a fresh
interpreter: it sets the process's intra-op threads and counts the process's threads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FREES = r"""
import json, os, threading
import torch
from rlweave.devices.openmp import release_thread_pool

torch.set_num_threads(2)
x = torch.ones(1 << 20)
tasks = lambda: len(os.listdir("/proc/self/task"))
x.add_(1)  # the main thread's pool
base, out = tasks(), {}

def other():
    x.mul_(2)  # a second thread's parallel region: a pool of its own
    out["during"] = tasks()
    out["released"] = release_thread_pool()
    out["after"] = tasks()
    x.mul_(2)  # the thread computes again after releasing: a new pool, same result
    out["again"] = tasks()
    out["released_again"] = release_thread_pool()

t = threading.Thread(target=other)
t.start()
t.join()
print(json.dumps({"base": base, **out, "value": float(x[0]), "main_released": release_thread_pool(),
                  "main_after": tasks()}))
"""


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_thread_frees_the_openmp_workers_it_started():
    pytest.importorskip("torch")
    r = _run(FREES)
    if not r["released"]:
        pytest.skip("this torch build does not use GNU OpenMP")
    # the other thread (+1) and its one pool worker (+1), then the worker is gone
    assert r["during"] == r["base"] + 2 and r["after"] == r["base"] + 1, r
    assert r["again"] == r["base"] + 2 and r["released_again"], r
    assert r["value"] == 8.0  # computing after a release is unaffected
    assert r["main_released"] and r["main_after"] == r["base"] - 1, r  # the main thread's own pool, too


def test_nothing_is_done_or_imported_without_torch():
    r = _run("import json, sys\nfrom rlweave.devices.openmp import release_thread_pool\n"
             "print(json.dumps({'released': release_thread_pool(), 'torch': 'torch' in sys.modules}))")
    assert r == {"released": False, "torch": False}
