"""What every rank-level worker receives, and its base class.

A worker is a plain Python class. The Ray scheduler (``rlweave.scheduler``) creates one
instance per rank inside a Ray actor; a test or a GPU box without Ray can create it
directly in one process. The controller fills a :class:`WorkerContext`; the worker reads
its own plugin section as a validated model (``ctx.options_as(TheOptionsModel)``) and the
model description from ``ctx.model``. How the rank's process is set up (CPU threads, memory
allocator) is the scheduler's business and not part of the context.

Failure: a method that meets bad input or a bug raises an ordinary exception; the controller
gets it as a ``WorkerError`` naming role, rank and method, and the run stops. A worker whose
own machinery is gone while its process lives (an engine whose engine process died) raises
:class:`rlweave.worker_errors.WorkerLost`: like a dead process, that rank is rebuilt when
the run allows restarts (``run.max_restarts``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, TypeVar

M = TypeVar("M")


@dataclass
class WorkerContext:
    """Where a rank sits and what it is asked to build.

    Attributes:
        role: role name (``policy``, ``rollout``, ``reference``, ``critic``, ``reward``).
        rank / world_size: this rank inside the role's own worker group.
        master_addr / master_port: rendezvous of the group's torch.distributed group.
        device: ``"cpu"`` or ``"cuda"`` (virtual devices on a GPU-less machine are CPU).
        options: the role's ``options`` section, validated once by the controller into the
            selected plugin's options model (its record's ``config_model``; defaults defined
            there alone). A dict given here (tests, embedders; or a plugin without a model) is
            validated by the worker: see :meth:`options_as`.
        model: model description (``path``, ``dtype``, ``model_type``, ``trust_remote_code``...).
        seed: base seed of the run; workers derive per-rank seeds from it.
        parallel: parallel sizes for this role (``{"dp": 2, "tp": 1}``): the
            ``roles.<role>.parallel`` mapping, already checked against the dimensions the
            plugin declares (a dimension it does not list never reaches it).
        optim: the role's validated ``optim`` section (:class:`rlweave.interfaces.optim.OptimSection`,
            defaults defined there alone) when the role trains, else None. A dict given here or
            as ``extra["optim"]`` (tests, embedders) is validated into one.
        lora: the role's validated ``lora`` section (:class:`rlweave.interfaces.lora.LoRASection`)
            when the role trains LoRA adapters, else None; a dict given here or as
            ``extra["lora"]`` is validated into one.
        optim_total_steps: optimizer steps of the whole run, for a schedule whose
            ``optim.total_steps`` is null (``extra["total_steps"]`` is read the same way).
        kernels: the kernels selected for this role that its backend uses (``kernels.<name>`` /
            ``roles.<role>.kernels.<name>``): name -> ``"module:attribute"`` of the kernel object;
            read them with :meth:`kernel`.
        extra: anything else a plugin passes to its workers.
    """

    role: str = "policy"
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    device: str = "cpu"
    options: Any = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    parallel: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    optim: Any = None
    optim_total_steps: int | None = None
    lora: Any = None
    kernels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        extra = self.extra if isinstance(self.extra, dict) else {}
        if self.optim is None and extra.get("optim") is not None:
            self.optim = extra["optim"]
        if isinstance(self.optim, dict):
            from rlweave.interfaces.optim import OptimSection

            self.optim = OptimSection.model_validate(self.optim)
        if self.optim_total_steps is None and extra.get("total_steps"):
            self.optim_total_steps = int(extra["total_steps"])
        if self.lora is None and extra.get("lora") is not None:
            self.lora = extra["lora"]
        if isinstance(self.lora, dict):
            from rlweave.interfaces.lora import LoRASection

            self.lora = LoRASection.model_validate(self.lora)
        typed = ("optim", "total_steps", "lora")
        if any(k in extra for k in typed):  # now in the typed fields; the caller's dict stays as it is
            self.extra = {k: v for k, v in extra.items() if k not in typed}

    def kernel(self, name: str) -> Any:
        """The kernel object named ``name`` (what its plugin's record points at, imported on
        the first call), or None when the run did not select it for this role."""
        target = self.kernels.get(name)
        if target is None:
            return None
        from rlweave.targets import import_target

        try:
            return import_target(target)
        except Exception as exc:
            raise RuntimeError(f"role {self.role} rank {self.rank}: kernel '{name}' ({target}) could not be loaded: "
                               f"{type(exc).__name__}: {exc}") from exc

    def options_as(self, model_cls: type[M]) -> M:
        """The ``options`` section as an instance of ``model_cls`` (the worker's plugin schema).

        An instance of ``model_cls`` (what the controller hands over) is returned as it is, not
        validated again; a mapping or None (empty) is validated into a new one, leaving
        ``options`` unchanged. Raises pydantic's ``ValidationError`` (naming the bad keys) for
        invalid values, and TypeError for a model of another class."""
        opts = self.options
        if isinstance(opts, model_cls):
            return opts
        if opts is None or isinstance(opts, Mapping):
            return model_cls.model_validate(dict(opts or {}))
        raise TypeError(f"role {self.role} rank {self.rank}: options are a {type(opts).__name__}; "
                        f"expected {model_cls.__name__} or a dict of its fields")


class Worker:
    """Base class of rank workers. Subclasses keep ``__init__`` cheap; heavy set-up goes
    into an explicit method the controller calls (``init_model``/``init_engine``).

    ``init_distributed`` joins the role's torch.distributed group (gloo on CPU, NCCL on
    CUDA), meeting at a store rank 0 serves on its node's address only
    (:mod:`rlweave.rendezvous`); it is a no-op for world size 1 unless ``force`` is set.
    """

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    def init_distributed(self, force: bool = False, timeout_s: float = 300.0) -> None:
        import datetime

        import torch.distributed as dist

        if dist.is_initialized() or (self.ctx.world_size == 1 and not force):
            return
        from rlweave.rendezvous import tcp_store

        os.environ.setdefault("MASTER_ADDR", self.ctx.master_addr)
        os.environ.setdefault("MASTER_PORT", str(self.ctx.master_port))
        backend = "nccl" if self.ctx.device == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        store = tcp_store(self.ctx.master_addr, self.ctx.master_port, self.ctx.world_size, self.ctx.rank == 0, timeout)
        dist.init_process_group(backend=backend, store=store, rank=self.ctx.rank, world_size=self.ctx.world_size,
                                timeout=timeout)

    def ping(self) -> dict[str, Any]:
        """Health check: returns role, rank and pid."""
        return {"role": self.ctx.role, "rank": self.ctx.rank, "pid": os.getpid()}

    def shutdown(self) -> None:
        """Release process groups and resources; called once before the actor exits."""
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
