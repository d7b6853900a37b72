"""One Ray cluster of several raylets on this machine, shared by every test in this folder.

``ray.cluster_utils.Cluster`` starts a head node (no GPUs: no rank ever lands there, so it can
host the drivers and is never lost) and :data:`GPU_NODES` worker nodes of one CPU and one
virtual GPU each, so a role that takes one device per node is spread over distinct nodes: the
widest run takes :data:`SPREAD` of them, and one more is there to replace a node a test kills
(a node started during a test module would outlive it, which the workspace's process guard
forbids). Every
node binds 127.0.0.1 (started inside :func:`rlweave.scheduler.ray_impl.cluster.loopback`;
``node_ip_address`` 127.0.0.1), its session files live in a temporary folder removed at the
end, and Ray's health checks are tightened so a killed node is noticed in seconds. Runs join it
as a user's would: ``rlweave train`` with ``ray.address`` (the test process's environment does
not keep Ray on loopback: ``start_ray`` must do it for a loopback address).

:class:`NodeCluster` adds, kills and replaces nodes, starts a node that cannot see a directory
(:meth:`NodeCluster.private_node`) and lists every process of the cluster. At the end the
cluster is shut down, every one of its processes is checked gone (stragglers are killed and
reported) and the temporary folder removed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
SPREAD = 3  #: GPU nodes the widest placement takes
GPU_NODES = SPREAD + 1  #: ... and a spare for the node-loss test
LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
PRIVATE_NODE = Path(__file__).with_name("private_node.py")


def _load_workspace_builder() -> Any:
    """``build_grpo_workspace`` of ``tests/conftest.py`` (a tiny Qwen2 and the arithmetic data)."""
    spec = importlib.util.spec_from_file_location("rlweave_e2e_workspace", REPO / "tests" / "conftest.py")
    mod = sys.modules.get(spec.name)
    if mod is None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclass looks its module up
        spec.loader.exec_module(mod)
    return mod.build_grpo_workspace


def unshare_prefix(scratch: Path) -> list[str] | None:
    """The command prefix that runs a process in a mount namespace of its own where it may
    mount a tmpfs (tried on ``scratch``, an empty directory), or None where this machine allows
    neither as root nor in a user namespace (then the private-node test is skipped)."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--mount", "--propagation", "private"],
                   ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]):
        probe = subprocess.run([*prefix, "mount", "-t", "tmpfs", "rlweave-probe", str(scratch)],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    return None


def tree(pid: int) -> set[int]:
    """``pid`` and its descendants (empty when it is gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return {pid, *(p.pid for p in proc.children(recursive=True))}
    except psutil.Error:
        return set()


def inet_addresses(pids: set[int]) -> set[tuple[str, str]]:
    """``(local address, status)`` of every IPv4/IPv6 socket of ``pids``."""
    import psutil

    out = set()
    for pid in pids:
        try:
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                out.add((conn.laddr.ip, conn.status))
        except psutil.Error:
            continue
    return out


def nodes_of(run_dir: Path) -> dict[str, set[str]]:
    """role -> Ray node ids of its ranks (``workers.json``)."""
    from rlweave.testing.runs import workers

    return {role: {r["node_id"] for r in ranks} for role, ranks in workers(run_dir).items()}


def ranks_left(run_dir: Path, timeout_s: float = 15.0) -> list[int]:
    """The rank processes of a finished run (``workers.json``; they run under the nodes' raylets,
    not under ``rlweave train``) still alive after ``timeout_s``."""
    import psutil

    from rlweave.testing.runs import workers

    procs = []
    for ranks in workers(run_dir).values():
        for r in ranks:
            try:
                procs.append(psutil.Process(r["pid"]))
            except psutil.Error:
                pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return [p.pid for p in alive]


class NodeCluster:
    """The shared cluster (see the module docstring)."""

    def __init__(self, root: Path):
        from ray.cluster_utils import Cluster

        self.root = root
        self._private: list[subprocess.Popen] = []
        self.cluster = Cluster(initialize_head=False, shutdown_at_exit=True)
        self.address = ""

    def start(self) -> None:
        """Start the head, then the GPU nodes side by side, and wait for all of them."""
        from rlweave.scheduler.ray_impl.cluster import loopback

        with loopback():
            self.cluster.add_node(num_cpus=1, num_gpus=0, node_ip_address="127.0.0.1", include_dashboard=False,
                                  temp_dir=str(self.root / "ray"), _system_config=HEALTH_CHECKS)
        self.address = self.cluster.address
        for _ in range(GPU_NODES):
            self.add_gpu_node(wait=False)
        self.cluster.wait_for_nodes(timeout=120)

    def add_gpu_node(self, wait: bool = True) -> str:
        """Start a worker node with one CPU and one virtual GPU; its node id. (Within a test
        module, only for a node the module also stops: see the module docstring.)"""
        from rlweave.scheduler.ray_impl.cluster import loopback

        with loopback():
            node = self.cluster.add_node(wait=wait, num_cpus=1, num_gpus=1, node_ip_address="127.0.0.1")
        return node.node_id

    def gpu_node_ids(self) -> list[str]:
        """Ids of the worker nodes this object started and has not killed."""
        return [n.node_id for n in self.cluster.worker_nodes]

    def kill_node(self, node_id: str) -> set[int]:
        """SIGKILL every process of a worker node at once (raylet, agents and the worker
        processes it started), as a crashed machine; returns their pids. (A worker process
        outlives a killed raylet for a while, still answering calls.)"""
        node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
        pids = set().union(*(tree(p.process.pid) for infos in node.all_processes.values() for p in infos))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.cluster.remove_node(node, allow_graceful=False)  # reaps them
        return pids

    @contextmanager
    def private_node(self, hidden: Path, gpus: int, prefix: list[str]) -> Iterator[str]:
        """A worker node (``gpus`` virtual GPUs) whose processes see an empty tmpfs at ``hidden``
        (:mod:`private_node` under ``prefix``, an :func:`unshare_prefix`); yields its node id
        once Ray reports it alive, stops it and waits until Ray reports it dead."""
        script = 'mount -t tmpfs rlweave-private "$1" && shift && exec "$@"'
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        proc = subprocess.Popen([*prefix, "sh", "-c", script, "sh", str(hidden), sys.executable, str(PRIVATE_NODE),
                                 self.address, str(gpus)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self._private.append(proc)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        node_id = None
        try:
            deadline = time.monotonic() + 60
            while node_id is None or not _alive(node_id):
                node_id = node_id or next((json.loads(x)["node_id"] for x in list(lines) if x.startswith("{")), None)
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the private node did not start: {''.join(lines)[-3000:]}")
                time.sleep(0.2)
            yield node_id
        finally:
            _stop(proc)
            deadline = time.monotonic() + 30
            while node_id is not None and _alive(node_id) and time.monotonic() < deadline:
                time.sleep(0.2)

    def processes(self) -> set[int]:
        """Pids of every process of the cluster: each node's processes and their descendants
        (the worker processes are children of their raylet), private nodes included."""
        pids: set[int] = set()
        for node in self.cluster.list_all_nodes():
            for infos in node.all_processes.values():
                for info in infos:
                    pids |= tree(info.process.pid)
        for proc in self._private:
            pids |= tree(proc.pid)
        return pids

    def shutdown(self) -> set[int]:
        """Stop every node; returns the pids that outlived it (killed)."""
        import psutil

        pids = self.processes()
        for proc in self._private:
            _stop(proc)
        self.cluster.shutdown()
        procs = []
        for pid in pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=15)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        return {p.pid for p in alive}


def _alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM a private node's launcher (it stops its node's processes), SIGKILL after 20 s."""
    pids = tree(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    import psutil

    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="package")
def nodes() -> Iterator[NodeCluster]:
    """The cluster, with this test process connected to it as a driver (``start_ray`` with
    ``ray.address``); torn down after the last test of the folder."""
    from rlweave.config.schema import RaySection
    from rlweave.scheduler import shutdown_ray, start_ray

    shutdown_ray()  # a connection left by another module would hide the join below
    root = Path(tempfile.mkdtemp(prefix="rlw-mn-", dir="/tmp"))  # short: Ray's socket paths must fit
    cluster = NodeCluster(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")  # inherited by the nodes and by the runs' controllers
        try:
            cluster.start()
            start_ray(RaySection(address=cluster.address))
            yield cluster
        finally:
            shutdown_ray()
            left = cluster.shutdown()
            shutil.rmtree(root, ignore_errors=True)
    if left:
        pytest.fail(f"processes of the multi-node cluster outlived its shutdown (killed): {sorted(left)}")


@pytest.fixture(scope="package")
def workspace(tmp_path_factory) -> Any:
    """The tiny Qwen2 model and arithmetic data of the end-to-end tests, with their config writer."""
    return _load_workspace_builder()(tmp_path_factory.mktemp("multi-node"))
