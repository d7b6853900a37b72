"""Start, join and stop Ray.

``start_ray`` with no ``ray.address`` starts a private local cluster: loopback only (every
Ray process binds 127.0.0.1), no dashboard unless ``ray.dashboard``, token auth off
(``RAY_AUTH_MODE=disabled`` unless set), and, on a machine without GPUs, the devices the
placement needs declared as virtual GPUs (``num_gpus``), so the same placement runs
everywhere; there, with ``ray.cpu_malloc_reuse``, this process and the cluster's processes
keep freed memory for reuse (:mod:`rlweave.scheduler.ray_impl.malloc`). With ``ray.address``
it joins that cluster as is; an address on the loopback interface (``127.0.0.1:6379``,
``localhost:6379``: a cluster whose nodes bind loopback, e.g. several raylets on one
machine) is joined over loopback too, where Ray would otherwise replace the address with the
machine's own IP and wait for a GCS that does not listen there. Whether a rank of a gpu pool
runs on a GPU is decided by the rank from what its own process sees (no CUDA device: CPU),
on a joined cluster as on a local one.

``shutdown_ray`` disconnects and, for a local cluster, waits until every Ray process it
started (GCS, raylet, agents, workers) has exited, killing stragglers.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from rlweave.scheduler.ray_impl.malloc import cpu_malloc

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RaySection

_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray resolves the node address to 127.0.0.1
_started_local = False


def real_gpu_count() -> int:
    """CUDA devices this process can see (0 without torch or CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


def gpus_are_virtual() -> bool:
    """Whether this process started the local cluster on a machine without GPUs, so the
    ranks of gpu pools run on CPU (virtual devices). Only a hint for how a rank's process
    starts (:func:`rlweave.scheduler.ray_impl.malloc.start_env`); each rank decides its device
    from what it sees (:meth:`~rlweave.scheduler.ray_impl.actor.WorkerActor.setup`), so the
    virtual GPUs of a joined cluster run on CPU as well."""
    return _started_local and real_gpu_count() == 0


def is_loopback_address(address: str | None) -> bool:
    """Whether a ``host:port`` Ray address names this machine's loopback interface."""
    if not address or "://" in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def loopback() -> Iterator[None]:
    """Ray resolves this machine's address to 127.0.0.1 inside the block (and processes it
    starts meanwhile inherit that), instead of to the IP of its network interface."""
    from ray._private import ray_constants

    old_env, old_const = os.environ.get(_LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_LOOPBACK_ENV] = "0"  # inherited by the raylet and workers: they bind loopback too
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process may have imported Ray already
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_const
        if old_env is None:
            os.environ.pop(_LOOPBACK_ENV, None)
        else:
            os.environ[_LOOPBACK_ENV] = old_env


def start_ray(ray_cfg: "RaySection | None" = None, needs_gpus: int = 0) -> None:
    """Connect this process to Ray (idempotent: does nothing when already connected).

    ``needs_gpus``: GPU devices the placement takes (see
    :func:`rlweave.config.placement.required_devices`); declared as virtual GPUs on a
    local cluster without real ones unless ``ray.virtual_gpus`` says how many.
    """
    import ray

    from rlweave.config.schema import RaySection

    global _started_local
    cfg = ray_cfg or RaySection()
    if ray.is_initialized():
        return
    if cfg.address:
        _started_local = False
        if not is_loopback_address(cfg.address):
            ray.init(address=cfg.address, log_to_driver=True)
            return
        with loopback():
            ray.init(address=cfg.address, _node_ip_address="127.0.0.1", log_to_driver=True)
        return

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    num_gpus = None
    if real_gpu_count() == 0:
        num_gpus = cfg.virtual_gpus if cfg.virtual_gpus is not None else int(needs_gpus)
    # everything runs on CPU: this process and the cluster's (inheriting the variable) keep freed memory
    cpu_malloc(cfg.cpu_malloc_reuse and num_gpus is not None)

    with loopback():
        ray.init(
            address="local",
            num_cpus=cfg.num_cpus,
            num_gpus=num_gpus,
            include_dashboard=cfg.dashboard,
            dashboard_host="127.0.0.1",
            _node_ip_address="127.0.0.1",
            _system_config=None if cfg.worker_niceness is None else {"worker_niceness": int(cfg.worker_niceness)},
            log_to_driver=True,
            logging_level=logging.WARNING,  # Ray's own start-up lines are not the user's
        )
    _started_local = True


def ray_processes() -> list:
    """Ray's processes under this one (GCS, raylet, agents, workers) as psutil objects."""
    import ray  # noqa: F401 - puts Ray's bundled psutil on sys.path
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            name, cmd = p.name(), " ".join(p.cmdline())
        except psutil.Error:
            continue
        if name in ("raylet", "gcs_server") or cmd.startswith("ray::") or "/ray/" in cmd or "ray." in name:
            out.append(p)
    return out


def shutdown_ray(timeout_s: float = 15.0) -> None:
    """Disconnect; for a local cluster, make sure its processes are gone (idempotent)."""
    import ray

    global _started_local
    if not ray.is_initialized():
        return
    procs = ray_processes() if _started_local else []
    ray.shutdown()
    if _started_local:
        cpu_malloc(False)  # processes started from now on get glibc's defaults again
    _started_local = False
    if not procs:
        return
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


@contextmanager
def ray_session(ray_cfg: "RaySection | None" = None, needs_gpus: int = 0) -> Iterator[None]:
    """``start_ray`` ... ``shutdown_ray``, also when the body raises."""
    start_ray(ray_cfg, needs_gpus)
    try:
        yield
    finally:
        shutdown_ray()
