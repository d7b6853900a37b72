"""What a rank is built from, whatever runs it: its :class:`~rlweave.interfaces.worker.WorkerContext`
(:func:`worker_context`), the method that initialises it (:func:`init_method`), and the arguments
every role builder takes (:class:`BuilderInputs`).

Framework-agnostic: the Ray role builder (:mod:`rlweave.scheduler.ray_impl.build`) and the
in-process one (:mod:`rlweave.scheduler.in_process`) build ranks with these, and so does
``rlweave export`` (one worker, no scheduler).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rlweave.config.placement import devices_per_rank, spans_of
from rlweave.interfaces.worker import WorkerContext

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RunConfig
    from rlweave.plugins.types import PluginRecord


def init_method(record: Any, worker_cls: type) -> str | None:
    """``init_engine`` for engines, ``init_model`` for backends (or whichever the class has)."""
    kind = getattr(record, "kind", None)
    if kind == "engine":
        return "init_engine"
    if kind == "backend":
        return "init_model"
    for name in ("init_model", "init_engine"):
        if hasattr(worker_cls, name):
            return name
    return None


def worker_context(cfg: "RunConfig", role: str, rank: int, addr: tuple[str, int],
                   total_steps: int | None = None, record: Any = None,
                   kernel_records: Mapping[str, Any] | None = None) -> WorkerContext:
    """Rank ``rank``'s context: ``options`` validated by ``record``'s ``config_model`` (a dict
    of the section when there is no record or it has no model); ``kernels`` from the kernels
    selected for the role that ``record`` uses, their targets from ``kernel_records`` (name ->
    kernel record; default: the installed plugins)."""
    from rlweave.config.kernels import role_kernels
    from rlweave.config.resolve import NEVER_TRAINED

    section = cfg.roles[role]
    trains = section.optim is not None and role not in NEVER_TRAINED
    model = section.model if section.model is not None else cfg.model
    schema = getattr(record, "config_model", None)
    options = schema.model_validate(dict(section.options)) if schema is not None else dict(section.options)
    return WorkerContext(
        role=role,
        rank=rank,
        world_size=section.devices // devices_per_rank(section.parallel, spans_of(record)),
        master_addr=addr[0],
        master_port=addr[1],
        options=options,
        model=model.model_dump(),
        seed=cfg.run.seed,
        parallel=dict(section.parallel),
        optim=section.optim if trains else None,
        optim_total_steps=int(total_steps) if total_steps else None,
        lora=_lora(cfg, role, section, trains),
        kernels=_kernel_targets(role_kernels(cfg, role, record), kernel_records),
    )


def _lora(cfg: "RunConfig", role: str, section: Any, trains: bool) -> Any:
    """A trained role's own ``lora``; the rollout's is the policy's when it receives the adapter
    itself (``weight_sync.lora: adapter``)."""
    if trains:
        return section.lora
    policy = cfg.roles.get("policy")
    if role == "rollout" and cfg.weight_sync.lora == "adapter" and policy is not None:
        return policy.lora
    return None


def _kernel_targets(names: Sequence[str], records: Mapping[str, Any] | None) -> dict[str, str]:
    if not names:
        return {}
    if records is None or any(n not in records for n in names):
        from rlweave.plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
        records = {**(records or {}), **{n: pm.get("kernel", n) for n in names if n not in (records or {})}}
    return {n: records[n].target for n in names}


class BuilderInputs:
    """What a role builder is given: the run's config, role -> plugin record, the roles to build
    (in order, duplicates dropped), role -> optimizer total steps, and the kernel records
    (``None``: the installed plugins). Base of the Ray and the in-process builders."""

    def __init__(self, cfg: "RunConfig", records: Mapping[str, "PluginRecord"], roles: Sequence[str],
                 optimizer_total_steps: Mapping[str, int] | None = None,
                 kernel_records: Mapping[str, "PluginRecord"] | None = None) -> None:
        self.cfg = cfg
        self.records = dict(records)
        self.kernel_records = dict(kernel_records) if kernel_records is not None else None
        self.roles = list(dict.fromkeys(roles))
        self.totals = dict(optimizer_total_steps or {})
