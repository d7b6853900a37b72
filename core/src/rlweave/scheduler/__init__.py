"""The single controller: roles as worker groups, dispatch, futures.

Light at import: names are resolved on first use, and only the Ray parts import Ray.

* :class:`RoleHandle`, :class:`RoleFuture` (framework-agnostic, :mod:`rlweave.scheduler.handle`
  etc.) and the errors their calls raise, :class:`WorkerError`, :class:`WorkerTimeout`,
  :class:`WorkerLost` (defined in :mod:`rlweave.worker_errors`, below the scheduler);
* :func:`start_ray`, :func:`shutdown_ray`, :func:`ray_session`, :func:`build_roles`,
  :class:`RoleBuilder` (Ray, :mod:`rlweave.scheduler.ray_impl`);
* :class:`InProcessRoleBuilder` (every role in this process, no Ray:
  :mod:`rlweave.scheduler.in_process`).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RoleHandle": "rlweave.scheduler.handle",
    "RoleFuture": "rlweave.scheduler.future",
    "WorkerError": "rlweave.worker_errors",
    "WorkerTimeout": "rlweave.worker_errors",
    "WorkerGroup": "rlweave.scheduler.group",
    "LocalWorkerGroup": "rlweave.scheduler.local",
    "start_ray": "rlweave.scheduler.ray_impl.cluster",
    "shutdown_ray": "rlweave.scheduler.ray_impl.cluster",
    "ray_session": "rlweave.scheduler.ray_impl.cluster",
    "build_roles": "rlweave.scheduler.ray_impl.build",
    "RoleBuilder": "rlweave.scheduler.ray_impl.build",
    "WorkerLost": "rlweave.worker_errors",
    "InProcessRoleBuilder": "rlweave.scheduler.in_process",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlweave.scheduler' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
