"""``DeepSpeedWorker``: one rank of a role trained or scored inside a DeepSpeed ZeRO engine.

Contract: :class:`rlweave.interfaces.backend.TrainingWorker`, as the ``fsdp`` backend keeps it:
the Hugging Face model layer is the core's (:class:`~rlweave.backend_helpers.hf_model.worker.HFModelWorker`:
token-budgeted micro-batches, packed rows with exact varlen attention, shared prompts, empty
micro-batches so every rank runs as many forwards, ``causal_lm``/``value``/``reward`` heads,
HF export, the CPU fast paths); what differs lives here:

* the model runs inside ``deepspeed.initialize`` (:mod:`.engine`) with the role's torch AdamW
  (``optim``) and the config of :mod:`.ds_json`: ZeRO stage 1/2/3 over the role's ranks,
  optimizer offload and (stage 3) parameter offload to host memory, bf16 parameters with fp32
  master weights (``mixed_precision: bf16``);
* gradients: micro-batch losses are summed and multiplied by the number of ranks (DeepSpeed
  averages over data-parallel ranks), so the gradient is that of the loss summed over all
  tokens of all ranks; DeepSpeed accumulates them and reduces at the step rlweave marks as
  the boundary (``managed_gradient_accumulation: false``);
* the step: DeepSpeed computes the global gradient norm, clips to ``optim.grad_clip`` and
  skips the update when the norm is NaN or inf. A micro-batch whose loss is NaN or inf has
  its gradient made NaN, so such a step is skipped on every rank too (``skipped`` 1.0; the
  LR schedule counts applied updates only);
* weights leave one full parameter at a time (:mod:`.weights`), checkpoints hold full fp32
  tensors and load at any world size (:mod:`.checkpoint`).

Not supported (refused by validation, :mod:`.checks`, and again by ``init_model`` with a
config error naming the setting): LoRA, sequence parallelism, mixture-of-experts models,
``model.dtype`` other than float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from rlweave.backend_helpers import finite
from rlweave.backend_helpers.device import rank_device
from rlweave.backend_helpers.hf_model import attention, modeling, prepare
from rlweave.backend_helpers.hf_model import vision as vision_forward
from rlweave.backend_helpers.hf_model.moe_blocks import find_blocks
from rlweave.backend_helpers.hf_model.options import FixedPaths
from rlweave.backend_helpers.hf_model.worker import HFModelWorker
from rlweave.backend_helpers.training import model_dtype

from rlweave_backend_deepspeed import checkpoint, ds_json, engine, weights
from rlweave_backend_deepspeed.config import DeepSpeedConfig


class DeepSpeedWorker(HFModelWorker):
    """Trains and/or scores one model on one rank under DeepSpeed ZeRO (see module docstring)."""

    backend = "deepspeed"
    engine: Any = None
    frozen_names: frozenset[str] | set[str] = frozenset()  # a frozen vision tower's parameters

    # ------------------------------------------------------------------ build
    def init_model(self) -> None:
        ctx = self.ctx
        self.cfg = ctx.options_as(DeepSpeedConfig)
        self.kind = ctx.model.get("model_type", "causal_lm")
        self.device = rank_device(ctx, "deepspeed")
        self.init_distributed(force=True)
        sp = int((ctx.parallel or {}).get("sp", 1))
        if sp > 1:
            raise ValueError(f"deepspeed backend: roles.{ctx.role}.parallel.sp={sp}: sequence parallelism is not "
                             "supported; use backend: fsdp")
        if ctx.lora is not None:
            raise ValueError(f"deepspeed backend: roles.{ctx.role}.lora: LoRA is not supported; use backend: fsdp")
        dtype_name, _ = model_dtype(ctx, "deepspeed")
        if dtype_name != "float32":
            raise ValueError(f"deepspeed backend: role {ctx.role}: model.dtype {dtype_name!r}; the backend loads float32 "
                             "weights (set options.mixed_precision: bf16 for bf16 compute)")
        if self.cfg.offload_param != "none" and self.cfg.zero_stage != 3:
            raise ValueError(f"deepspeed backend: roles.{ctx.role}.options.offload_param needs zero_stage: 3")
        seed = self.cfg.seed if self.cfg.seed is not None else ctx.seed
        bf16 = self.cfg.mixed_precision == "bf16"
        self.attn_impl = attention.choose(self.cfg.attn_implementation, ctx.device)
        self.packing = self.cfg.use_packing
        model = modeling.load_model(ctx.model, self.attn_impl, torch.float32, seed, backend=self.backend)
        self.frozen_names = (vision_forward.freeze_tower(model, f"roles.{ctx.role}.options.freeze_vision_tower")
                             if self.cfg.freeze_vision_tower else set())
        if find_blocks(model):
            raise ValueError(f"deepspeed backend: role {ctx.role}: mixture-of-experts models are not supported; "
                             "use backend: fsdp")
        paths = FixedPaths(mixed_precision=self.cfg.mixed_precision, cpu=self.cfg.cpu)
        self.choices = prepare.apply_cpu_paths(model, paths, self.device.type, bf16, self.world_size,
                                               backend=self.backend, dtype_name=dtype_name, role=ctx.role,
                                               rank=self.rank)
        prepare.apply_activation_checkpointing(model, self.cfg.activation_checkpointing)
        self.skip_names = {"lm_head.weight"} if modeling.tied_lm_head(model) else set()
        self.model = model
        self.step = 0
        self.offloaded = False
        self.stream_stats = weights.StreamStats()
        grad_clip = ctx.optim.grad_clip if ctx.optim is not None else None
        config = ds_json.build(self.cfg, grad_clip)
        if ctx.optim is not None:
            # torch AdamW + LR schedule over the trained parameters (all but a frozen vision tower)
            self._build_optimizer(ctx.optim, [p for p in model.parameters() if p.requires_grad])
        if ctx.optim is None and self.cfg.zero_stage < 3:
            # nothing to shard for a role that only scores: ZeRO 1/2 shard optimizer state and gradients
            self.engine = None
            self.model = model.to(self.device)
        else:
            self.engine = engine.start(model, self.optimizer, config, self.device)
            self.model = self.engine.module
        self.base_optimizer = engine.base_optimizer(self.engine) if self.engine is not None else None
        if ctx.optim is not None:
            self.optimizer = self.engine.optimizer  # the ZeRO optimizer (its param_groups carry the LR)
        torch.manual_seed(seed + 1000 + self.rank)  # per-rank dropout stream

    # ------------------------------------------------------- the HF model layer's hooks
    def _forward(self, **kw: Any):
        """Through the engine (ZeRO-3 gathers parameters in its hooks); the bare model for a
        scoring role without one."""
        module = self.engine if self.engine is not None else self.model
        return module(**kw, use_cache=False)

    def _backward(self, loss: torch.Tensor) -> None:
        if not bool(torch.isfinite(loss.detach())):
            loss = loss * float("nan")  # a NaN gradient: DeepSpeed's overflow check skips the step on all ranks
        self.engine.backward(loss, scale_wrt_gas=False)

    def _update(self, loss_sum: float) -> tuple[float, bool]:
        """DeepSpeed's step: reduce, global norm, clip, skip on a non-finite norm, zero the
        gradients; the LR schedule steps after an applied update."""
        self.engine.step()
        applied = bool(self.engine.was_step_applied())
        if applied:
            self.scheduler.step()
        norm = self.engine.get_global_grad_norm()
        return (float(norm) if norm is not None else float("nan")), not applied

    # ------------------------------------------------------------------ state
    def _state_bytes(self) -> tuple[int, int]:
        """Bytes of this rank's parameters (its ZeRO-3 shards) and of its optimizer partitions
        (fp32 master weights and AdamW state)."""
        pb = 0
        for p in self.model.parameters():
            t = getattr(p, "ds_tensor", None)
            pb += (t if t is not None else p).numel() * p.element_size()
        ob = 0
        base = self.base_optimizer
        if base is not None:
            for group in base.param_groups:
                for fp in group["params"]:
                    ob += fp.numel() * fp.element_size()
                    for v in base.state.get(fp, {}).values():
                        if torch.is_tensor(v):
                            ob += v.numel() * v.element_size()
        return pb, ob

    def offload(self) -> dict[str, Any]:
        """Move this rank's state to host memory between phases: on CUDA through DeepSpeed's
        ``offload_states`` (ZeRO-3 only: stages 1 and 2 raise NotImplementedError naming the
        option); on a CPU device nothing moves and the bytes are counted."""
        if self.device.type == "cuda" and not self.offloaded:
            if not engine.is_zero3(self.engine) or self.base_optimizer is None:
                raise NotImplementedError(f"deepspeed backend: offloading role {self.ctx.role} between phases needs "
                                          "zero_stage: 3 with an optimizer; set options.zero_stage: 3 or turn "
                                          "residency offload off for this role")
            pb, ob = self._state_bytes()
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            self.engine.offload_states()
            torch.cuda.synchronize()
            self.offloaded = True
            freed = before - torch.cuda.memory_allocated()
            return {"freed_bytes": int(freed), "moved_bytes": pb + ob, "param_bytes": pb, "optim_bytes": ob,
                    "device": "cuda"}
        return super().offload()

    def onload(self) -> dict[str, Any]:
        if self.device.type == "cuda" and self.offloaded:
            before = torch.cuda.memory_allocated()
            self.engine.reload_states()
            torch.cuda.synchronize()
            self.offloaded = False
            return {"loaded_bytes": int(torch.cuda.memory_allocated() - before)}
        return super().onload()

    def _stream(self, dtype: torch.dtype | None = None, device: str = "cpu",
                skip: set[str] | frozenset[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
        return weights.stream(self.model, engine.is_zero3(self.engine), self.rank, self.skip_names | set(skip),
                              self.stream_stats, dtype, device)

    def named_weights(self, dtype: torch.dtype | None = None, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors, one gathered parameter at a time; rank 0 yields (all ranks iterate)."""
        self._check_ready("named_weights")
        yield from self._stream(dtype, device, skip=self.frozen_names)  # a frozen vision tower: the engine has it

    def stream_report(self) -> dict[str, int]:
        """What the last weight stream held on this rank: ``peak_gathered`` elements gathered at
        once beyond the rank's shards (ZeRO-3; 0 otherwise) and the ``largest`` parameter's."""
        return {"peak_gathered": self.stream_stats.peak_gathered, "largest": self.stream_stats.largest}

    def _export_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._stream()

    def save_adapter(self, path: str) -> None:
        raise ValueError(f"deepspeed backend: role {self.ctx.role} has no LoRA adapters (the deepspeed backend does not "
                         "train LoRA); export the full model")

    def save_checkpoint(self, path: str) -> None:
        """Full-tensor checkpoint into ``path`` (:mod:`.checkpoint`); all ranks call it.

        Refuses on every rank, before anything is written, when this rank's parameter shards,
        fp32 master partitions or AdamW state hold a NaN or an inf (FloatingPointError naming
        the role, the ranks and each rank's first non-finite tensor)."""
        self._check_ready("save_checkpoint")
        self._refuse_nonfinite(path, finite.first_nonfinite(self.model, self.base_optimizer))
        extra = {"step": self.step, "scheduler": self._schedule_state()}
        checkpoint.save(path, self.model, self.base_optimizer, extra, self.rank, self.cfg.zero_stage,
                        self.cfg.checkpoint_shard_bytes)

    def load_checkpoint(self, path: str) -> None:
        self._check_ready("load_checkpoint")
        zero_optimizer = self.optimizer if self.base_optimizer is not None else None
        extra = checkpoint.load(path, self.model, zero_optimizer, self.rank, engine.is_zero3(self.engine))
        self.step = extra.get("step", 0)
        self._load_schedule(extra.get("scheduler"))
