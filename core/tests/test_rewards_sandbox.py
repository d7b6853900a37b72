"""The reward worker sandbox: memory limit, CPU budget, private directory, process and
network refusal, and that nothing a reward starts outlives its call or its worker.

Safe on a small machine: the 10 GB allocation fails at once under the default limit, the
growing allocation runs under a 256 MiB limit, the fork bomb is refused at its first fork,
and with processes allowed only a few sleeping children are started."""

import json
import os
import socket
import textwrap
import time

import pytest
from rlweave.sandbox.limits import SandboxLimits
from rlweave.sandbox.pool import RewardPool, RewardWorkerError
from rlweave.rewards.sections import RewardSandbox

REWARDS = textwrap.dedent(
    """
    import json, os, socket, subprocess, time

    def ok(prompt, response, **_):
        return 1.0

    def alloc_10gb(prompt, response, **_):
        data = bytes(10 * 1024**3)  # calloc: untouched pages, were it ever allowed
        return float(len(data))

    def grow(prompt, response, **_):
        chunks = []
        while True:
            chunks.append(b"x" * (16 << 20))  # written, so really resident

    def spin(prompt, response, **_):
        while True:
            try:
                while True:
                    pass
            except Exception:  # a careless reward cannot swallow the CPU limit
                pass

    def fork_bomb(prompt, response, **_):
        root = os.getpid()
        for _ in range(5):  # exponential, but bounded (32 processes) should the refusal ever break
            os.fork()
        if os.getpid() != root:
            time.sleep(30)
            os._exit(0)
        return 1.0

    def start(prompt, response, how, **_):
        if how == "subprocess":
            subprocess.run(["true"])
        elif how == "system":
            os.system("true")
        elif how == "posix_spawn":
            os.posix_spawn("/bin/true", ["true"], {})
        elif how == "fork_exec":
            import _posixsubprocess
            _posixsubprocess.fork_exec()
        return 1.0

    def connect(prompt, response, port, **_):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return 1.0

    def lookup(prompt, response, **_):
        socket.getaddrinfo("localhost", 80)
        return 1.0

    def where(prompt, response, out, **_):
        import tempfile
        with open(out, "w") as f:
            json.dump({"cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "TMPDIR": os.environ.get("TMPDIR"),
                       "pid": os.getpid(), "sid": os.getsid(0)}, f)
        return 1.0

    def fork_return(prompt, response, **_):
        return 2.0 if os.fork() == 0 else 1.0  # the child returns into the worker loop too

    def sleepers(prompt, response, out, hang=False, **_):
        pids = [subprocess.Popen(["sleep", "1000"]).pid for _ in range(3)]
        pids.append(subprocess.Popen(["sleep", "1000"], start_new_session=True).pid)
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # a double fork: the grandchild leaves the session and is orphaned
            os.setsid()
            if os.fork() == 0:
                os.write(w, str(os.getpid()).encode())
                time.sleep(1000)
            os._exit(0)
        os.waitpid(child, 0)
        pids.append(int(os.read(r, 32)))
        with open(out, "w") as f:
            json.dump(pids, f)
        if hang:
            time.sleep(1000)
        return 1.0
    """
)

BIG_IMPORT = "payload = bytearray(200 << 20)\n\ndef f(prompt, response, **_):\n    return 1.0\n"


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    import sys

    d = tmp_path_factory.mktemp("sandboxrewards")
    (d / "sandbox_rewards_s.py").write_text(REWARDS)
    (d / "big_import_s.py").write_text(BIG_IMPORT)
    sys.path.insert(0, str(d))  # spawn children inherit the parent's sys.path
    yield "sandbox_rewards_s"
    sys.path.remove(str(d))


NAMES = ["ok", "alloc_10gb", "grow", "spin", "fork_bomb", "start", "connect", "lookup", "where", "sleepers",
         "fork_return"]


def make_pool(mod, **kw):
    timeout_s = kw.pop("timeout_s", 10.0)
    return RewardPool([f"{mod}:{n}" for n in NAMES], workers=1, timeout_s=timeout_s, sandbox=SandboxLimits(**kw))


def call(pool, name, **kwargs):
    t0 = time.perf_counter()
    (outcome,) = pool.run([(NAMES.index(name), {"prompt": "p", "response": "r", **kwargs})])
    return outcome, time.perf_counter() - t0


def alive(pid):
    """Running (a zombie or a missing process is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def worker_pid(pool):
    return pool._slots[0].proc.pid


def test_defaults_match_the_config():
    assert SandboxLimits().__dict__ == RewardSandbox().model_dump()
    pool = RewardPool(["rlweave.rewards.rules:arith_exact"], timeout_s=3.0)  # without a sandbox argument: the defaults
    assert pool.sandbox.memory_mb == 4096 and pool.sandbox.cpu_s == 3.0 and not pool.sandbox.processes
    assert pool.run([(0, {"prompt": "1+1=", "response": "2", "answer": 2})]) == [("ok", 1.0)]
    pool.close()
    pool = RewardPool(["rlweave.rewards.rules:arith_exact"], sandbox=RewardSandbox(processes=True, cpu_s=2))
    assert pool.sandbox == SandboxLimits(processes=True, cpu_s=2.0)  # the config section is taken as it is


def test_a_10gb_allocation_fails_fast_under_the_default_limit(mod):
    pool = make_pool(mod)
    try:
        call(pool, "ok")
        pid = worker_pid(pool)
        (status, msg), took = call(pool, "alloc_10gb")
        assert status == "error" and msg.startswith("MemoryError") and "reward_runtime.sandbox.memory_mb" in msg
        assert took < 2.0
        assert call(pool, "ok")[0] == ("ok", 1.0)
        assert worker_pid(pool) == pid and pool.replaced == 0  # the worker lives on
    finally:
        pool.close()


def test_memory_that_grows_stops_at_the_limit(mod):
    pool = make_pool(mod, memory_mb=256)
    try:
        (status, msg), took = call(pool, "grow")
        assert status == "error" and "MemoryError" in msg and "at most 256 MiB" in msg, msg
        assert took < 5.0
        assert call(pool, "ok")[0] == ("ok", 1.0) and pool.replaced == 0
    finally:
        pool.close()


def test_a_reward_that_does_not_fit_at_import_is_a_configuration_error(mod):
    pool = RewardPool(["big_import_s:f"], workers=1, sandbox=SandboxLimits(memory_mb=128))
    with pytest.raises(RewardWorkerError, match=r"(?s)MemoryError.*reward_runtime\.sandbox\.memory_mb"):
        pool.run([(0, {"prompt": "p", "response": "r"})])
    pool.close()


def test_an_endless_loop_uses_up_its_cpu_time_and_the_worker_stays(mod):
    pool = make_pool(mod, cpu_s=1.0, timeout_s=60.0)
    try:
        call(pool, "ok")
        pid = worker_pid(pool)
        (status, msg), took = call(pool, "spin")
        assert status == "error" and msg.startswith("CpuTimeExceeded") and "reward_runtime.sandbox.cpu_s" in msg
        assert took < 60.0  # 1-2 CPU seconds, but the machine may be shared
        assert call(pool, "ok")[0] == ("ok", 1.0)
        assert worker_pid(pool) == pid and pool.replaced == 0
    finally:
        pool.close()


def test_an_endless_loop_with_the_defaults_ends_within_its_timeout(mod):
    pool = make_pool(mod, timeout_s=2.0)  # cpu_s: null -> timeout_s
    try:
        call(pool, "ok")
        pid = worker_pid(pool)
        (status, _), took = call(pool, "spin")
        assert status in ("timeout", "error") and took < 2.0 + 3.0
        assert call(pool, "ok")[0] == ("ok", 1.0)
        if status == "timeout":
            assert not alive(pid)
    finally:
        pool.close()


def test_a_fork_bomb_is_stopped_at_its_first_fork(mod):
    pool = make_pool(mod)
    try:
        (status, msg), took = call(pool, "fork_bomb")
        assert status == "error" and took < 1.0
        assert msg.startswith("PermissionError: starting processes is denied in reward workers (os.fork)")
        assert "set reward_runtime.sandbox.processes: true" in msg
        for how, event in [("subprocess", "subprocess.Popen"), ("system", "os.system"),
                           ("posix_spawn", "os.posix_spawn"), ("fork_exec", "_posixsubprocess.fork_exec")]:
            (status, msg), _ = call(pool, "start", how=how)
            assert status == "error" and f"({event})" in msg, (how, msg)
        assert call(pool, "ok")[0] == ("ok", 1.0) and pool.replaced == 0
    finally:
        pool.close()


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    yield srv.getsockname()[1]
    srv.close()


def test_network_is_allowed_by_default_and_can_be_denied(mod, listener):
    pool = make_pool(mod)
    try:
        assert call(pool, "connect", port=listener)[0] == ("ok", 1.0)
    finally:
        pool.close()
    pool = make_pool(mod, network=False)
    try:
        (status, msg), took = call(pool, "connect", port=listener)
        assert status == "error" and took < 1.0
        assert "network access is denied in reward workers" in msg and "reward_runtime.sandbox.network: true" in msg
        (status, msg), _ = call(pool, "lookup")
        assert status == "error" and "(socket.getaddrinfo)" in msg
        assert call(pool, "ok")[0] == ("ok", 1.0)
    finally:
        pool.close()


def test_each_worker_has_its_own_directory_removed_with_it(mod, tmp_path, monkeypatch):
    (tmp_path / "rel_s.py").write_text("def r(prompt, response, **_):\n    return 2.0\n")
    monkeypatch.chdir(tmp_path)
    pool = RewardPool([f"{mod}:where", "rel_s.py:r"], workers=2, timeout_s=10.0)
    try:
        # a relative file path still loads in a worker elsewhere: the pool made it absolute
        assert pool.run([(1, {"prompt": "", "response": ""})]) == [("ok", 2.0)]
        dirs = [slot.workdir for slot in pool._slots]
        assert len(set(dirs)) == 2 and all(os.path.isdir(d) for d in dirs)
        out = tmp_path / "where.json"
        pool.run([(0, {"prompt": "", "response": "", "out": str(out)})])
        seen = json.loads(out.read_text())
        assert seen["cwd"] == seen["tmp"] == seen["TMPDIR"] and seen["cwd"] in dirs
        assert os.path.basename(seen["cwd"]).startswith("rlweave-reward-")
        assert seen["sid"] == seen["pid"]  # its own session (and process group)
        pool._replace(0)  # a replaced worker's directory goes with it
        assert not os.path.isdir(dirs[0]) and os.path.isdir(dirs[1]) and os.path.isdir(pool._slots[0].workdir)
        dirs.append(pool._slots[0].workdir)
    finally:
        pool.close()
    assert not any(os.path.isdir(d) for d in dirs)
    pool = make_pool(mod, private_dir=False)
    try:
        call(pool, "where", out=str(tmp_path / "shared.json"))
        assert json.loads((tmp_path / "shared.json").read_text())["cwd"] == str(tmp_path)
    finally:
        pool.close()


def test_allowed_processes_do_not_outlive_the_call(mod, tmp_path):
    pool = make_pool(mod, processes=True)
    out = str(tmp_path / "pids.json")
    try:
        outcome, _ = call(pool, "sleepers", out=out)
        assert outcome == ("ok", 1.0)
        with open(out) as f:
            pids = json.load(f)
        assert len(pids) == 5 and not any(alive(p) for p in pids)  # killed before the reply
        assert call(pool, "ok")[0] == ("ok", 1.0) and pool.replaced == 0
        assert [call(pool, "fork_return")[0] for _ in range(3)] == [("ok", 1.0)] * 3  # only the worker answers
        assert call(pool, "ok")[0] == ("ok", 1.0) and pool.replaced == 0
    finally:
        pool.close()


def test_a_timed_out_worker_is_killed_with_everything_it_started(mod, tmp_path):
    pool = make_pool(mod, processes=True, timeout_s=4.0)
    out = str(tmp_path / "pids.json")
    try:
        call(pool, "ok")
        pid = worker_pid(pool)
        (status, _), took = call(pool, "sleepers", out=out, hang=True)
        assert status == "timeout" and took < 4.0 + 3.0
        with open(out) as f:
            pids = json.load(f)
        assert not alive(pid) and not any(alive(p) for p in pids)
        assert call(pool, "ok")[0] == ("ok", 1.0)
    finally:
        pool.close()


ORPHAN = """
import time
from rlweave.sandbox.pool import RewardPool
if __name__ == "__main__":
    pool = RewardPool(["rlweave.rewards.rules:arith_exact"], workers=2)
    pool.run([(0, {"prompt": "1+1=", "response": "2", "answer": 2})])
    print(" ".join(f"{s.proc.pid} {s.workdir}" for s in pool._slots), flush=True)
    time.sleep(100)
"""


def test_workers_of_a_killed_parent_end_and_remove_their_directories(tmp_path):
    import signal
    import subprocess
    import sys

    script = tmp_path / "orphan_pool.py"
    script.write_text(ORPHAN)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        words = parent.stdout.readline().split()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    pids, dirs = [int(w) for w in words[0::2]], words[1::2]
    assert len(pids) == 2 and all(os.path.basename(d).startswith("rlweave-reward-") for d in dirs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (any(map(alive, pids)) or any(map(os.path.isdir, dirs))):
        time.sleep(0.05)
    assert not any(map(alive, pids)) and not any(map(os.path.isdir, dirs))
