"""Reward code cannot take the machine down: a huge allocation, an endless loop, a fork
bomb and a network request each end as an error outcome of that one call, quickly; the
pool answers the next call; nothing the reward started is left running.

The rewards are safe without the sandbox too: the 10 GB allocation is ``bytes(n)``
(calloc: nothing is touched), and the fork bomb is exponential but stops at 32 processes,
which this file kills (each writes its pid to a file) and which end by themselves in 5 s."""

from __future__ import annotations

import os
import signal
import socket
import textwrap
import time

import pytest

REWARDS = textwrap.dedent(
    """
    import os, socket, time

    def ok(prompt, response, **_):
        return 1.0

    def alloc_10gb(prompt, response, **_):
        return float(len(bytes(10 * 1024**3)))

    def endless(prompt, response, **_):
        while True:
            pass

    def fork_bomb(prompt, response, pids, **_):
        root = os.getpid()
        for _ in range(5):
            os.fork()
        if os.getpid() != root:  # unsandboxed: 31 processes, gone in 5 s (and killed by the test)
            with open(pids, "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(5)
            os._exit(0)
        return 1.0

    def connect(prompt, response, port, **_):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return 1.0
    """
)
NAMES = ["ok", "alloc_10gb", "endless", "fork_bomb", "connect"]


#: helpers multiprocessing starts once per process and keeps until it exits
SINGLETONS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def _singleton(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return any(marker in f.read() for marker in SINGLETONS)
    except OSError:
        return False


def _descendants() -> set[int]:
    """Live processes below this one (multiprocessing's own helpers aside)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(name)] = int(fields[1])
    found, stack = set(), [os.getpid()]
    while stack:
        me = stack.pop()
        for pid, ppid in parents.items():
            if ppid == me and pid not in found:
                found.add(pid)
                stack.append(pid)
    return {pid for pid in found if not _singleton(pid)}


@pytest.fixture
def pool_of(tmp_path, monkeypatch):
    """``pool_of(**sandbox)``: a one-worker pool over REWARDS; after the test, no process it
    started may be left (any found is killed, then reported)."""
    (tmp_path / "sandbox_probe_r.py").write_text(REWARDS)
    bomb_pids = tmp_path / "bomb_pids"
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _descendants()
    pools = []

    def make(timeout_s: float = 5.0, **sandbox):
        from rlweave.sandbox.pool import RewardPool

        kw = {}
        if sandbox:  # as a run gets it: reward_runtime.sandbox
            from rlweave.rewards.sections import RewardSandbox

            kw["sandbox"] = RewardSandbox(**sandbox)
        pools.append(RewardPool([f"sandbox_probe_r:{n}" for n in NAMES], workers=1, timeout_s=timeout_s, **kw))
        return pools[-1]

    make.bomb_pids = str(bomb_pids)
    yield make
    for pool in pools:
        pool.close()
    time.sleep(0.2)
    forked = [int(p) for p in bomb_pids.read_text().split()] if bomb_pids.exists() else []
    left = (_descendants() - before) | {p for p in forked if os.path.exists(f"/proc/{p}")}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left running after the pool closed: {sorted(left)}"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _call(pool, name: str, **kwargs):
    t0 = time.perf_counter()
    (outcome,) = pool.run([(NAMES.index(name), {"prompt": "p", "response": "r", **kwargs})])
    return outcome, time.perf_counter() - t0


def _next_call(pool) -> float:
    outcome, took = _call(pool, "ok")
    assert outcome == ("ok", 1.0), outcome
    return took


def test_a_10gb_allocation_fails_fast(pool_of, guarantee):
    pool = pool_of()  # the default sandbox, as RewardPool(targets, workers, timeout_s) gets it
    _next_call(pool)
    (status, msg), took = _call(pool, "alloc_10gb")
    assert status == "error" and msg.startswith("MemoryError"), (status, msg)
    assert took < 2.0 and pool.replaced == 0
    nxt = _next_call(pool)
    guarantee("reward sandbox: a reward allocating 10 GB gets an error, not the machine's memory",
              f"10 GB allocation -> MemoryError outcome in {took * 1000:.1f} ms under the default 4096 MiB limit; "
              f"the same worker answered the next call in {nxt * 1000:.1f} ms")


def test_an_endless_loop_ends_as_an_error_and_the_worker_stays(pool_of, guarantee):
    pool = pool_of(timeout_s=60.0, cpu_s=1.0)
    _next_call(pool)
    pid = pool._slots[0].proc.pid
    cpu0 = _cpu_s(pid)
    (status, msg), took = _call(pool, "endless")
    cpu = _cpu_s(pid) - cpu0
    assert status == "error" and msg.startswith("CpuTimeExceeded"), (status, msg)
    assert took < 60.0  # 1-2 CPU seconds, but the machine may be shared
    nxt = _next_call(pool)
    assert pool._slots[0].proc.pid == pid and pool.replaced == 0
    guarantee("reward sandbox: an endless loop ends as an error within its limits, the worker is kept",
              f"while True: pass -> CpuTimeExceeded outcome after {cpu:.2f} CPU s, {took:.2f} s wall (cpu_s 1, "
              f"timeout_s 60); the same worker answered the next call in {nxt * 1000:.1f} ms")


def test_a_fork_bomb_stops_at_its_first_fork(pool_of, guarantee):
    pool = pool_of()  # processes are refused by default
    _next_call(pool)
    before = _descendants()
    (status, msg), took = _call(pool, "fork_bomb", pids=pool_of.bomb_pids)
    assert status == "error" and "starting processes is denied in reward workers (os.fork)" in msg, (status, msg)
    assert "reward_runtime.sandbox.processes" in msg
    assert took < 2.0 and _descendants() <= before
    nxt = _next_call(pool)
    guarantee("reward sandbox: a fork bomb is stopped at its first fork",
              f"fork bomb (os.fork() loop) -> PermissionError outcome in {took * 1000:.1f} ms, no process started; "
              f"the same worker answered the next call in {nxt * 1000:.1f} ms")


def test_network_access_can_be_denied(pool_of, guarantee):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        pool = pool_of(network=False)
        _next_call(pool)
        (status, msg), took = _call(pool, "connect", port=port)
        assert status == "error" and "network access is denied in reward workers" in msg, (status, msg)
        assert "reward_runtime.sandbox.network" in msg and took < 2.0
        nxt = _next_call(pool)
    finally:
        srv.close()
    guarantee("reward sandbox: network access refused when reward_runtime.sandbox.network is false",
              f"connect to a listening 127.0.0.1 port -> PermissionError outcome in {took * 1000:.1f} ms; "
              f"the same worker answered the next call in {nxt * 1000:.1f} ms")
