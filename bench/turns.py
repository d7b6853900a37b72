"""Option sets measured side by side: each set in its own process, the sets taking turns.

A benchmark script calls :func:`run_turns` with its own path; every turn runs
``script --child '<json [options, payload]>' *args`` once per set, and the child prints one
line ``RESULT <json>`` (:func:`emit`). Separate processes keep process-wide state (patched
libraries, allocator, compiled code) from leaking between sets; taking turns spreads a
noisy neighbour over all of them. Children start with the allocator settings rlweave gives
its CPU workers (``ray.cpu_malloc_reuse``), unless ``GLIBC_TUNABLES`` is already set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable


def parse_set(text: str) -> dict:
    """``key=value,key=value`` -> options (values parsed as JSON when they parse)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
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
    from rlweave.scheduler.ray_impl.malloc import start_env

    env = {**os.environ, **start_env(True, True)}  # as a rank process of rlweave starts
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
