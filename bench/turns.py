"""Option sets measured side by side: each set in its own process, the sets taking turns.

A benchmark script calls :func:`run_turns` with its own path; every turn runs
``script --child '<json [options, payload]>' *args`` once per set, and the child prints one
line ``RESULT <json>`` (:func:`emit`). Separate processes keep process-wide state (patched
libraries, allocator, compiled code) from leaking between sets; taking turns spreads a
noisy neighbour over all of them. Children start with the allocator settings rlweave gives
its CPU workers (``ray.cpu_malloc_reuse``), unless ``GLIBC_TUNABLES`` is already set;
a single-process benchmark gets them with :func:`as_rank_process`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable


def rank_env() -> dict[str, str]:
    """This environment plus the allocator settings a CPU rank of rlweave starts with."""
    from rlweave.scheduler.ray_impl.malloc import start_env

    return {**os.environ, **start_env(True, True)}


def as_rank_process() -> None:
    """Re-execute this script with :func:`rank_env` unless ``GLIBC_TUNABLES`` is set already
    (glibc reads it only at start): without it every fresh output page-faults, and matmul-heavy
    code looks several times slower than it runs in rlweave's workers."""
    if "GLIBC_TUNABLES" not in os.environ:
        os.execve(sys.executable, [sys.executable, *sys.argv], rank_env())


def parse_set(text: str) -> dict:
    """``key=value,key=value`` -> options (values parsed as JSON when they parse; a dotted key
    such as ``cpu.kernels`` sets a key of a nested section)."""
    out: dict = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        *parents, leaf = key.strip().split(".")
        section = out
        for p in parents:
            section = section.setdefault(p, {})
        try:
            section[leaf] = json.loads(value)
        except json.JSONDecodeError:
            section[leaf] = value.strip()
    return out


def label(opts: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in opts.items()) or "(defaults)"


def emit(result: Any) -> None:
    """In a child: hand ``result`` (JSON-able) back to :func:`run_turns`."""
    print("RESULT " + json.dumps(result), flush=True)


def run_turns(script: str, sets: list[dict], payload: Any, args: list[str], repeat: int,
              describe: Callable[[Any], str]) -> list[list[Any]]:
    """Every set's results, turn by turn (``describe(result)`` is printed after each run);
    exits naming the set when a child fails."""
    env = rank_env()
    results: list[list[Any]] = [[] for _ in sets]
    for turn in range(repeat):
        for i, opts in enumerate(sets):
            proc = subprocess.run([sys.executable, script, "--child", json.dumps([opts, payload]), *args],
                                  capture_output=True, text=True, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not lines:
                sys.exit(f"set {label(opts)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            results[i].append(json.loads(lines[-1][len("RESULT "):]))
            print(f"turn {turn + 1}/{repeat}: {label(opts)}: {describe(results[i][-1])}", flush=True)
    return results
