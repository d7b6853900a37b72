"""What ``run.scheduler: in_process`` refuses, checked when the config is loaded.

The in-process scheduler (:mod:`rlweave.scheduler.in_process`) builds every role's worker in
the controller process, one rank each, and runs calls one after another. So, before any worker
starts, a config with ``run.scheduler: in_process`` must have:

* one rank per needed role: ``roles.<role>.devices`` divided by the devices one rank spans
  (an engine rank spanning ``tp`` devices counts once) is 1;
* ``run.max_restarts: 0`` (a worker in this process cannot be replaced);
* ``weight_sync.transport`` ``auto`` or ``in_process`` (the others need a process per rank);
* no ``ray.address`` (no Ray is started or joined).

``run.in_process_threads`` is refused with another scheduler.

Pure Python, like :mod:`rlweave.config.placement`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rlweave.config.placement import devices_per_rank

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RunConfig

IN_PROCESS = "in_process"
#: weight transports that work between roles in one process
TRANSPORTS = ("auto", "in_process")


def in_process_problems(cfg: "RunConfig", role_names: Sequence[str],
                        rank_spans: Mapping[str, Sequence[str]] | None = None) -> list[tuple[str, str]]:
    """Every reason ``cfg`` cannot run with ``run.scheduler: in_process``, as ``(dotted path,
    message)``; empty for another scheduler or a config that fits. ``role_names``: the roles the
    algorithm needs; ``rank_spans``: role -> the parallel sizes one of its ranks spans (its
    plugin record's ``rank_spans``)."""
    if cfg.run.scheduler != IN_PROCESS:
        if cfg.run.in_process_threads:
            return [("run.in_process_threads", f"run.in_process_threads applies to run.scheduler 'in_process', not "
                     f"{cfg.run.scheduler!r}: remove it, or set run.scheduler: in_process")]
        return []
    why = "run.scheduler 'in_process' builds every role in this process"
    out: list[tuple[str, str]] = []
    for role in dict.fromkeys(role_names):
        section = cfg.roles.get(role)
        if section is None:
            continue
        ranks = section.devices // devices_per_rank(section.parallel, (rank_spans or {}).get(role, ()))
        if ranks != 1:
            out.append((f"roles.{role}.devices", f"{why}, one rank per role, but role {role!r} has {ranks} ranks "
                        f"(devices {section.devices}, parallel {dict(section.parallel) or {}}); use one device, or "
                        "run.scheduler: ray"))
    if cfg.run.max_restarts:
        out.append(("run.max_restarts", f"{why}: a lost worker cannot be replaced, so the run cannot restart; set "
                    "run.max_restarts: 0, or use run.scheduler: ray"))
    if cfg.weight_sync.transport not in TRANSPORTS:
        out.append(("weight_sync.transport", f"weight_sync.transport {cfg.weight_sync.transport!r} needs each role "
                    f"in its own process; {why}: use {' or '.join(TRANSPORTS)}"))
    if cfg.ray.address:
        out.append(("ray.address", f"ray.address joins a Ray cluster, but {why} and starts no Ray; remove it, or "
                    "use run.scheduler: ray"))
    return out
