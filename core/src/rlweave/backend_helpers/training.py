"""The training-worker skeleton every training backend shares: :class:`TrainingSkeleton`.

A backend's worker subclasses it and keeps only what differs between backends: building and
sharding the model (``init_model``), planning micro-batches (``_plan``), running them forward
and backward (``_accumulate``), reducing and clipping gradients (``_clip``, or the whole
optimizer step, ``_update``), which ranks report metrics (``_reports_metrics``) and the
checkpoint format. The skeleton holds the rest:

* :meth:`TrainingSkeleton.train_step`: checks (an optimizer, not offloaded, the loss
  function's temperature), the micro-batch count all-reduced to the maximum (every rank runs
  as many forwards, as sharded collectives need), the non-finite skip agreed by all ranks
  (:mod:`.finite`), the optimizer and LR-schedule step, and the metrics merged over ranks;
* the optimizer (AdamW, fused where torch has it, with :class:`.schedule.WarmupSchedule`),
  built from the role's typed ``OptimSection``, and its schedule's state in checkpoints
  (:meth:`TrainingSkeleton._schedule_state`, :meth:`TrainingSkeleton._load_schedule`);
* offload/onload of parameters and optimizer state between phases (CUDA; a no-op that still
  counts bytes on a CPU device);
* the readiness check, moving a :class:`~rlweave.data.batch.Batch` to the device, the
  ``model.dtype`` table.

What a backend must provide is declared on the class: its abstract methods (instantiating a
worker that lacks one raises TypeError naming them) and the attributes ``init_model`` sets
(listed in :class:`TrainingSkeleton`'s docstring). ``backend`` names the backend in every
error message.
"""

from __future__ import annotations

import math
import time
from abc import ABCMeta, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Iterator

import torch
import torch.distributed as dist

from rlweave.backend_helpers.device import move_optimizer_state
from rlweave.backend_helpers.finite import any_rank, local_shard
from rlweave.backend_helpers.schedule import WarmupSchedule, restore_schedule, schedule_state
from rlweave.data.batch import Batch
from rlweave.interfaces.backend import LossFn, TrainingWorker, merge_metric

#: ``model.dtype`` values and their torch dtypes
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_dtype(ctx: Any, backend: str) -> tuple[str, torch.dtype]:
    """``(name, torch dtype)`` of ``ctx.model['dtype']`` (default ``float32``); ValueError
    naming the role and the choices for another value."""
    name = ctx.model.get("dtype", "float32")
    if name not in DTYPES:
        raise ValueError(f"{backend} backend: model.dtype {name!r} (role {ctx.role}); choose {sorted(DTYPES)}")
    return name, DTYPES[name]


def loss_settings(loss_fn: LossFn, kind: str, backend: str) -> tuple[bool, float]:
    """``(with_entropy, temperature)`` a loss function asks for (``needs_entropy``, default
    True, only for a ``causal_lm``; ``temperature``, default 1.0); ValueError unless the
    temperature is > 0."""
    entropy = bool(getattr(loss_fn, "needs_entropy", True)) and kind == "causal_lm"
    temperature = float(getattr(loss_fn, "temperature", 1.0))
    if not temperature > 0:
        raise ValueError(f"{backend} backend: loss function {type(loss_fn).__name__} has temperature {temperature}; "
                         "it must be > 0")
    return entropy, temperature


def on_device(b: Batch, device: torch.device) -> Batch:
    """``b`` with its token, sample and vision tensors on ``device`` (offsets stay where they
    are); samples that share one vision-input dict (a prompt's samples) share its copy."""
    mv = lambda d: {k: v.to(device) for k, v in d.items()}
    moved: dict[int, dict] = {}
    for m in b.mm:
        if m is not None and id(m) not in moved:
            moved[id(m)] = mv(m)
    return Batch(cu_seqlens=b.cu_seqlens, token=mv(b.token), sample=mv(b.sample), ids=b.ids, meta=b.meta,
                 mm=[None if m is None else moved[id(m)] for m in b.mm])


class TrainingSkeleton(TrainingWorker, metaclass=ABCMeta):
    """What training backends share (see the module docstring).

    A backend implements the abstract methods: ``init_model`` and the operations of
    :class:`~rlweave.interfaces.backend.TrainingWorker` (``compute_logprobs``,
    ``named_weights``, ``save_checkpoint``, ``load_checkpoint``, ``save_hf``), and the train
    step's ``_plan`` and ``_accumulate``; and either ``_clip`` (the default ``_update``'s
    gradient reduction and clipping) or ``_update`` itself (an optimizer that reduces, clips
    and skips by itself). Instantiating a worker that lacks one raises TypeError naming what
    is missing. It may override the hooks ``_step_metrics``, ``_reports_metrics``,
    ``_move_extra_state`` and ``_state_bytes``.

    ``init_model`` sets these attributes, which the skeleton reads:

    * ``cfg``: the backend's options, with ``max_tokens_per_micro_batch`` and
      ``max_tokens_per_forward`` (None: twice the former);
    * ``kind``: ``ctx.model['model_type']`` (``causal_lm``, ``value`` or ``reward``);
    * ``device``: this rank's ``torch.device``;
    * ``model``: the module whose parameters are trained, offloaded and counted;
    * ``step = 0`` and ``offloaded = False``;
    * for a role with ``optim``: :meth:`_build_optimizer` (sets ``optimizer``, ``scheduler``
      and ``optim_cfg``; a backend may then replace ``optimizer`` by a wrapper with the same
      ``param_groups``)."""

    backend: ClassVar[str] = "training"
    cfg: Any
    kind: str
    device: torch.device
    model: torch.nn.Module
    step: int
    offloaded: bool
    optim_cfg: Any = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None

    def __new__(cls, *args: Any, **kwargs: Any):
        self = super().__new__(cls)  # TypeError naming the abstract methods a backend lacks
        if cls._update is TrainingSkeleton._update and cls._clip is TrainingSkeleton._clip:
            raise TypeError(f"Can't instantiate training backend {cls.__name__}: it implements neither _clip "
                            "(gradient reduction and clipping, for the skeleton's _update) nor _update (the whole "
                            "optimizer step)")
        return self

    # ------------------------------------------------------ what a backend provides
    @abstractmethod
    def init_model(self) -> None:
        """Build the model, shard it, and set the attributes listed in the class docstring."""

    @abstractmethod
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0,
                         with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """See :class:`~rlweave.interfaces.backend.TrainingWorker`."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """See :class:`~rlweave.interfaces.backend.TrainingWorker`."""

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """See :class:`~rlweave.interfaces.backend.TrainingWorker`; store
        :meth:`_schedule_state` and restore it with :meth:`_load_schedule`."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """See :class:`~rlweave.interfaces.backend.TrainingWorker`."""

    @abstractmethod
    def save_hf(self, path: str) -> None:
        """See :class:`~rlweave.interfaces.backend.TrainingWorker`."""

    # ------------------------------------------------------------------ build
    def _build_optimizer(self, o: Any, params: Iterable[torch.nn.Parameter] | None = None) -> None:
        """AdamW over ``params`` (default: the model's) and its LR schedule from ``o``, the
        role's ``OptimSection``. Fused AdamW (CPU and CUDA, DTensor-aware) where torch offers
        it for these parameters, else the per-tensor loop."""
        self.optim_cfg = o
        params = list(self.model.parameters() if params is None else params)
        kw = {"lr": o.lr, "betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
        try:
            self.optimizer = torch.optim.AdamW(params, fused=True, **kw)
        except (RuntimeError, TypeError, ValueError):
            self.optimizer = torch.optim.AdamW(params, **kw)
        sched = WarmupSchedule(o.warmup_steps, o.schedule, o.total_steps or self.ctx.optim_total_steps, o.min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, sched)

    def _schedule_state(self) -> dict[str, Any] | None:
        """What a checkpoint stores of the LR schedule (None: the role has none); JSON values."""
        return schedule_state(self.scheduler)

    def _load_schedule(self, state: dict[str, Any] | None) -> None:
        """Restore the LR schedule from a checkpoint's :meth:`_schedule_state` (None: nothing
        saved), the one way every backend resumes its schedule
        (:func:`.schedule.restore_schedule`)."""
        restore_schedule(self.scheduler, state)

    def _refuse_nonfinite(self, path: str, bad: str | None) -> None:
        """Before a checkpoint is written (collective): ``bad`` is this rank's first non-finite
        tensor (None: none). When any rank has one, raises FloatingPointError on every rank
        naming the role, the ranks and their tensors, so nothing is written and no non-finite
        value reaches a checkpoint (a resume would only repeat the failure)."""
        if any_rank(bad is not None, self.device):
            found = [(r, b) for r, b in enumerate(self._gather(bad)) if b is not None]
            where = "; ".join(f"rank {r}: {b}" for r, b in found)
            raise FloatingPointError(
                f"{self.backend} backend: refusing to save checkpoint {path} of role {self.ctx.role} (called on rank "
                f"{self.rank}): non-finite values in {where}. Nothing was written; resume from an earlier checkpoint.")

    # ---------------------------------------------------------------- helpers
    def _max_over_ranks(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def _check_ready(self, what: str) -> None:
        if self.offloaded and self.device.type == "cuda":
            raise RuntimeError(f"{self.backend} backend: {what} on role {self.ctx.role} rank {self.rank} while "
                               "offloaded; call onload()")

    def _on_device(self, b: Batch) -> Batch:
        return on_device(b, self.device)

    def _forward_budget(self) -> int:
        """Tokens per micro-batch of a forward without gradients (``max_tokens_per_forward``,
        default twice the training budget: no activations are kept for backward)."""
        return self.cfg.max_tokens_per_forward or 2 * self.cfg.max_tokens_per_micro_batch

    # ------------------------------------------------------------ train step
    @abstractmethod
    def _plan(self, batch: Batch, budget: int) -> list[list[int]]:
        """Micro-batches (lists of sample indices) of a non-empty ``batch`` within ``budget`` tokens."""

    @abstractmethod
    def _accumulate(self, batch: Batch, groups: list[list[int]], n_micro: int, loss_fn: LossFn,
                    temperature: float, entropy: bool) -> tuple[float, dict[str, float]]:
        """Forward and backward of ``n_micro`` micro-batches: ``groups[i]`` for ``i <
        len(groups)``, then empty ones (zero loss, same collectives). Gradients accumulate in
        the parameters; returns this rank's summed loss and its loss-function metrics merged
        with :func:`~rlweave.interfaces.backend.merge_metric`."""

    def _clip(self) -> float:
        """Reduce the gradients as the backend needs, clip them to ``optim.grad_clip`` (0: no
        clipping) and return the global gradient norm (the same on every rank). Called by the
        default :meth:`_update` only: a backend overriding :meth:`_update` without calling it
        need not implement it (one of the two is required)."""
        raise NotImplementedError(f"{self.backend} backend: {type(self).__name__} implements no _clip")

    def _update(self, loss_sum: float) -> tuple[float, bool]:
        """Clip (:meth:`_clip`), then step the optimizer and the LR schedule unless the gradient
        norm or any rank's loss (``loss_sum``: this rank's) is NaN or inf; gradients are zeroed
        either way. Returns ``(global gradient norm, skipped)``, the same on every rank. A
        backend whose optimizer clips and skips by itself overrides this."""
        grad_norm = self._clip()
        # the norm is global already; a rank's loss is not (a NaN added to a loss has finite gradients)
        skipped = any_rank(not (math.isfinite(grad_norm) and math.isfinite(loss_sum)), self.device)
        if not skipped:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def _step_metrics(self) -> tuple[dict[str, float], dict[str, float]]:
        """Backend metrics of the step just taken, called on every rank after the optimizer
        step (may be collective): ``(per-rank values merged over ranks, global values)``."""
        return {}, {}

    def _reports_metrics(self) -> bool:
        """Whether this rank's loss, token and sample counts enter the step's metrics (one
        rank per data-parallel replica: others hold copies of the same values)."""
        return True

    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step (see :class:`~rlweave.interfaces.backend.TrainingWorker`).

        A step is skipped on every rank (``skipped`` 1.0) when the clipped gradient norm or the
        loss of any rank is NaN or inf: the gradients are dropped, parameters, optimizer state
        and the LR schedule stay as they were (the schedule counts applied updates, as DeepSpeed
        and Megatron-LM do on an overflow step), and the next step trains normally. ``self.step``
        counts calls, skipped ones included."""
        if self.optimizer is None:
            raise RuntimeError(f"{self.backend} backend: role {self.ctx.role} has no optimizer "
                               f"(roles.{self.ctx.role}.optim unset)")
        self._check_ready("train_step")
        t0 = time.perf_counter()
        self.model.train()
        groups = self._plan(batch, self.cfg.max_tokens_per_micro_batch) if len(batch) else []
        n_micro = self._max_over_ranks(len(groups))
        entropy, temperature = loss_settings(loss_fn, self.kind, self.backend)
        loss_sum, metrics = self._accumulate(batch, groups, n_micro, loss_fn, temperature, entropy)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm, skipped = self._update(loss_sum)
        self.step += 1
        per_rank, global_metrics = self._step_metrics()
        local = {"loss": loss_sum, "tokens": float(batch.num_tokens), "samples": float(len(batch)), **metrics,
                 **per_rank} if self._reports_metrics() else {}
        gathered = self._gather((local, time.perf_counter() - t0))
        out: dict[str, float] = {}
        for d, _ in gathered:
            for k, v in d.items():
                out[k] = merge_metric(k, out.get(k), v)
        out.update(grad_norm=grad_norm, lr=lr, time_s=max(t for _, t in gathered), num_micro_batches=float(n_micro),
                   skipped=float(skipped), **global_metrics)
        return out

    # ---------------------------------------------------------------- offload
    def _state_bytes(self) -> tuple[int, int]:
        """Bytes of this rank's parameter shards and optimizer state."""
        pb = sum(local_shard(p).numel() * p.element_size() for p in self.model.parameters())
        ob = 0
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                for v in st.values():
                    if torch.is_tensor(v):
                        ob += local_shard(v).numel() * v.element_size()
        return pb, ob

    def _move_extra_state(self, device: Any) -> None:
        """Move what a backend keeps beyond the model and the optimizer's per-parameter state
        (fp32 master weights, say) to ``device``, inside :meth:`offload` / :meth:`onload`'s
        measurement; default nothing."""

    def offload(self) -> dict[str, Any]:
        """Move this rank's parameter shards and optimizer state to CPU memory.

        Returns ``freed_bytes`` (measured: the drop of ``torch.cuda.memory_allocated``; 0 on a
        CPU device, where the state already lives in CPU memory), ``moved_bytes`` (bytes of
        the parameter shards and optimizer state) and the split ``param_bytes``/``optim_bytes``."""
        pb, ob = self._state_bytes()
        if self.offloaded:
            return {"freed_bytes": 0, "moved_bytes": 0, "param_bytes": pb, "optim_bytes": ob, "device": self.device.type}
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        freed = 0
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            self.model.to("cpu")
            move_optimizer_state(self.optimizer, "cpu")
            self._move_extra_state("cpu")
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            freed = before - torch.cuda.memory_allocated()
        self.offloaded = True
        return {"freed_bytes": int(freed), "moved_bytes": pb + ob if self.device.type == "cuda" else 0,
                "param_bytes": pb, "optim_bytes": ob, "device": self.device.type}

    def onload(self) -> dict[str, Any]:
        """Bring the state back to the device; returns ``loaded_bytes`` (measured on CUDA)."""
        if not self.offloaded:
            return {"loaded_bytes": 0}
        loaded = 0
        if self.device.type == "cuda":
            before = torch.cuda.memory_allocated()
            self.model.to(self.device)
            move_optimizer_state(self.optimizer, self.device)
            self._move_extra_state(self.device)
            torch.cuda.synchronize()
            loaded = torch.cuda.memory_allocated() - before
        self.offloaded = False
        return {"loaded_bytes": int(loaded)}
