"""``FSDPWorker``: one rank of a role trained or scored with torch FSDP2.

Contract: :class:`rlweave.interfaces.backend.TrainingWorker`. Every public operation is
called on all ranks of the role at once and runs the same number of forward passes on
every rank (the micro-batch count is all-reduced to the maximum; ranks with fewer run empty
micro-batches that add zero loss), because FSDP2's all-gathers and reduce-scatters must
match across ranks.

The Hugging Face model layer is the core's (:class:`rlweave.backend_helpers.hf_model.worker.HFModelWorker`):
micro-batches are formed by a token budget (``max_tokens_per_micro_batch``) and, with
``use_packing``, laid out as one row with per-sample positions and exact varlen attention.
With ``share_prompts`` (and rlweave's varlen attention), samples of a micro-batch with the
same prompt carry it once, and micro-batches keep such groups together; per-token results are
returned in the unshared layout. What is FSDP's lives here: sharding (:mod:`.parallelize`),
sequence parallelism, mixture-of-experts training, LoRA, the checkpoint format.
With ``parallel: {sp: N}`` (Ulysses sequence parallelism, :mod:`.sequence_parallel`), groups
of ``N`` consecutive ranks receive the same data and split each packed row between them;
every rank of a group returns the group's full results, and the token budgets count the
tokens of the whole row (per group, not per rank).
Gradients follow the token-weight convention: micro-batch losses are
summed, and multiplied by the number of ranks to undo FSDP's gradient averaging, so the
gradient is that of the loss summed over all tokens of all data-parallel groups.

Mixture-of-experts models (:mod:`.moe`): when the role selected the ``moe_groupgemm`` kernel,
it replaces the experts' forward before sharding (transformers' experts otherwise);
``train_step`` adds the router load-balancing loss (``moe_aux_loss_coef``) to each
micro-batch's loss under the same token weighting and reports ``moe_aux_loss`` and the
expert-load metrics; weights leave in checkpoint names (:mod:`.moe_layout`). Router replay
(:mod:`rlweave.backend_helpers.router_replay`): a batch's ``routing`` token field is replayed in
every pass (no-grad and training, activation recomputation included), and
``compute_logprobs(with_routing=True)`` records the routing of the pass.

LoRA (``ctx.lora``, :mod:`.lora`): PEFT adapters wrap the targeted linear layers before sharding;
only they (and ``modules_to_save``) train, sit in the optimizer and in checkpoints; weights leave
merged under the base model's names (``named_weights``, ``save_hf``); ``save_adapter`` writes the
PEFT adapter directory and ``compute_logprobs(adapters=False)`` gives the base model's log-probs.

Model kinds (``ctx.model['model_type']``): ``causal_lm`` (log-probs, entropy), ``value``
(prediction-aligned per-token values: ``values[t]`` is read at ``t-1``, 0 at first tokens)
and ``reward`` (score at each sample's last token). See
:mod:`rlweave.backend_helpers.hf_model.heads` and :mod:`.hf_export` for how heads are stored.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

from rlweave.backend_helpers import finite, router_replay
from rlweave.backend_helpers.device import rank_device
from rlweave.backend_helpers.hf_model import attention, micro, modeling, prefix
from rlweave.backend_helpers.hf_model import vision as vision_forward
from rlweave.backend_helpers.hf_model.outputs import Window
from rlweave.backend_helpers.hf_model.worker import HFModelWorker
from rlweave.backend_helpers.training import model_dtype
from rlweave.data.batch import Batch
from rlweave_backend_fsdp import checkpoint, checks, hf_export, lora, moe, parallelize
from rlweave_backend_fsdp import sequence_parallel as seqpar
from rlweave_backend_fsdp.config import FSDPConfig


class FSDPWorker(HFModelWorker):
    """Trains and/or scores one model shard on one rank (see module docstring); the train step,
    optimizer and offload are :class:`~rlweave.backend_helpers.training.TrainingSkeleton`'s, the
    HF model's forwards and outputs :class:`~rlweave.backend_helpers.hf_model.worker.HFModelWorker`'s."""

    backend = "fsdp"
    sp: seqpar.SPGroup | None = None  # this rank's Ulysses group (parallel.sp > 1)
    frozen_names: frozenset[str] | set[str] = frozenset()  # a frozen vision tower's parameters
    moe_state: moe.MoETraining | None = None  # set for a mixture-of-experts model
    moe_kernel: dict[str, Any] | None = None  # the moe_groupgemm kernel's report when it replaced experts

    # ------------------------------------------------------------------ build
    def init_model(self) -> None:
        ctx = self.ctx
        self.cfg = ctx.options_as(FSDPConfig)
        self.kind = ctx.model.get("model_type", "causal_lm")
        self.device = rank_device(ctx, "fsdp")
        self.init_distributed(force=True)
        sp = int((ctx.parallel or {}).get("sp", 1))
        self._refuse(checks.sp_problems(sp, self.cfg.model_dump(), None))
        self.sp = seqpar.new_group(self.world_size, self.rank, sp)
        seed = self.cfg.seed if self.cfg.seed is not None else ctx.seed
        dtype_name, dtype = model_dtype(ctx, "fsdp")
        # bf16 mixed precision keeps fp32 master weights and computes in bf16.
        param_dtype = torch.float32 if self.cfg.mixed_precision == "bf16" else dtype
        self.attn_impl = attention.choose("varlen" if sp > 1 else self.cfg.attn_implementation, ctx.device)
        self.packing = self.cfg.use_packing
        bf16 = self.cfg.mixed_precision == "bf16" or param_dtype == torch.bfloat16
        model = modeling.load_model(ctx.model, self.attn_impl, param_dtype, seed, backend=self.backend)
        self.frozen_names = (vision_forward.freeze_tower(model, f"roles.{ctx.role}.options.freeze_vision_tower")
                             if self.cfg.freeze_vision_tower else set())
        # the steps of parallelize.py, in its order
        blocks = moe.find_blocks(model)
        self._refuse(checks.moe_problems(sp, blocks[0].num_experts if blocks else None))
        self.moe_kernel = parallelize.apply_moe_kernel(model, blocks, ctx, self.device.type, self.rank)
        self._refuse(parallelize.apply_sequence_parallel(model, sp))
        self.choices = parallelize.apply_cpu_paths(model, self.cfg, self.device.type, bf16, self.world_size,
                                                   backend=self.backend, dtype_name=dtype_name, role=ctx.role,
                                                   rank=self.rank)
        parallelize.apply_activation_checkpointing(model, self.cfg.activation_checkpointing)
        layers = modeling.decoder_layers(model)
        model = parallelize.apply_lora(model, ctx.lora, self.kind, ctx.role)
        parallelize.apply_compile(layers, self.cfg.compile, self.choices.compile_scope)
        tower = vision_forward.tower(lora.base_of(model))
        parallelize.apply_fsdp(model, layers, self.device.type, self.world_size, self.cfg.mixed_precision,
                               self.cfg.reshard_after_forward, units=[tower] if tower is not None else [])
        if tower is not None:
            parallelize.first_forward(model, self.device)
        self.model = model
        coef = self.cfg.moe_aux_loss_coef
        if coef is None:
            coef = float(getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0)
        self.moe_state = moe.MoETraining(blocks, coef) if blocks else None
        self.router = router_replay.RouterReplay(blocks) if blocks else None
        self.skip_names = {"lm_head.weight"} if modeling.tied_lm_head(lora.base_of(model)) else set()
        self.step = 0
        self.offloaded = False
        if ctx.optim is not None:
            self._build_optimizer(ctx.optim, lora.trainable(self.model))  # all parameters, or the adapters only
        torch.manual_seed(seed + 1000 + self.rank)  # per-rank dropout stream

    def _refuse(self, problems: list[tuple[str, str]]) -> None:
        if problems:
            raise ValueError(f"{self.backend} backend: role {self.ctx.role}: "
                             + "; ".join(f"roles.{self.ctx.role}.{k}: {m}" for k, m in problems))

    # ------------------------------------------------- the HF model layer's hooks
    def _raw(self, ids: torch.Tensor, cu: torch.Tensor, shared: prefix.SharedRow | None = None,
             routing: torch.Tensor | None = None, record: bool = False,
             mm: list | None = None) -> tuple[torch.Tensor, Window | None]:
        """The HF model layer's forward; with sequence parallelism, only the positions of this
        rank's window (:meth:`_raw_sp`; MoE models, hence routing, are refused with it)."""
        if self.sp is not None:
            return self._raw_sp(ids, cu, shared, mm)
        return super()._raw(ids, cu, shared, routing=routing, record=record, mm=mm)

    def _after_forward(self, flat: torch.Tensor | None) -> None:
        if self.moe_state is not None:
            self.moe_state.tap.keep_rows(flat)

    def _raw_sp(self, ids: torch.Tensor, cu: torch.Tensor, shared: prefix.SharedRow | None,
                mm: list | None = None) -> tuple[torch.Tensor, Window]:
        """:meth:`_raw` on this rank's slice of the (padded) row, attention over the whole row; a
        vision-language model's rank gets the multimodal positions and image features of its slice
        (every rank runs the vision tower on the micro-batch's images)."""
        if shared is not None:
            row_ids, row_pos = shared.input_ids, shared.position_ids
        else:
            row_ids, row_pos = ids.cpu(), micro.positions(cu)
        part = seqpar.shard(row_ids, row_pos, self.sp)
        total = int(row_ids.numel())
        kw = {"input_ids": part.input_ids.view(1, -1).to(self.device),
              "position_ids": part.position_ids.view(1, -1).to(self.device),
              "attention_mask": None, "rlweave_sp": self.sp}
        vis = self._vision()
        if vis is not None:
            kw.update(vis.slice_inputs(ids, cu, mm or [], part.lo, part.n, self.device))
        if shared is not None:
            kw["rlweave_plan"] = attention.padded_plan(shared.plan, total, part.pad)
        else:
            bounds = cu.tolist() + ([total + part.pad] if part.pad else [])
            kw.update(micro.varlen_kwargs(torch.tensor(bounds), self.device))
        out = self._forward(**kw)
        raw = out if self.kind != "causal_lm" else out.logits
        return raw.squeeze(0), Window(part.lo, part.n, lambda x: seqpar.combine(x, self.sp))

    def _adapters_off(self) -> contextlib.AbstractContextManager:
        """The base model's forward: every adapter and ``modules_to_save`` copy switched off;
        ValueError for a role without adapters."""
        if not lora.is_peft(self.model):
            return super()._adapters_off()
        return lora.adapters_disabled(self.model)

    def _base_model(self) -> torch.nn.Module:
        return lora.base_of(self.model)

    # ------------------------------------------------------------ train step
    def _begin_accumulate(self, batch: Batch) -> None:
        """For a mixture-of-experts model each micro-batch's loss includes the weighted router
        load-balancing loss (:meth:`_extra_loss`), whose token-weighted mean is
        ``moe_aux_loss``; ``moe_load_max_over_mean``, ``moe_load_min_over_mean`` and
        ``moe_tokens_per_expert_max`` describe the tokens each expert received over all ranks
        (:func:`.moe.load_metrics`); with router replay, ``moe_replay_changed_frac`` is the share
        of the step's replayed routing decisions that differ from the routers' own
        (:class:`~rlweave.backend_helpers.router_replay.ChangedTally`)."""
        if self.moe_state is not None:
            self.moe_state.begin_step(batch.num_tokens, self.device)
        if self.router is not None:
            self.router.tally.reset(self.device)

    def _micro_scope(self) -> contextlib.AbstractContextManager:
        return self.moe_state.tap.capture() if self.moe_state is not None else contextlib.nullcontext()

    def _extra_loss(self, tokens: int) -> torch.Tensor | None:
        # the router load-balancing loss, token-weighted (see .moe)
        return self.moe_state.micro_loss(tokens) if self.moe_state is not None else None

    def _step_metrics(self) -> tuple[dict[str, float], dict[str, float]]:
        if self.moe_state is None:
            return {}, {}
        per_rank, global_ = self.moe_state.step_metrics(self.device)
        return per_rank, {**global_, **self.router.tally.metrics()}

    def _reports_metrics(self) -> bool:
        return self.sp is None or not self.sp.rank  # the group's first rank reports the group's (equal) values

    def _clip(self) -> float:
        from torch.distributed.tensor import DTensor

        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = float(self.optim_cfg.grad_clip or 0.0) or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------ state
    def named_weights(self, dtype: torch.dtype | None = None, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors, one at a time; rank 0 yields (``device``, default CPU)."""
        self._check_ready("named_weights")
        skip = self.skip_names | self.frozen_names  # a frozen vision tower: the engine has it already
        yield from hf_export.stream_full(self.model, self.rank, skip, dtype=dtype, device=device)

    def _export_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What ``save_hf`` writes: HF-named full tensors as stored, rank 0 yields (all ranks iterate)."""
        return hf_export.stream_full(self.model, self.rank, self.skip_names)

    def save_adapter(self, path: str) -> None:
        """A PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) that
        ``PeftModel.from_pretrained(base, path)`` loads; rank 0 writes, all ranks call. Raises
        ValueError for a role without adapters."""
        self._check_ready("save_adapter")
        if not lora.is_peft(self.model):
            raise ValueError(f"fsdp backend: role {self.ctx.role} has no LoRA adapters (roles.{self.ctx.role}.lora "
                             "is not set); export the full model")
        items = dict(lora.adapter_items(self.model))
        if self.rank == 0:
            lora.write_adapter(path, self.model, items)
        dist.barrier()

    def save_checkpoint(self, path: str) -> None:
        """Sharded checkpoint into ``path`` (:mod:`.checkpoint`); all ranks call it.

        Refuses on every rank, before anything is written, when a parameter or optimizer-state
        shard of any rank holds a NaN or an inf: raises FloatingPointError naming the role, the
        ranks and each rank's first non-finite tensor, so no non-finite value reaches a
        checkpoint (a resume would only repeat the failure)."""
        self._check_ready("save_checkpoint")
        self._refuse_nonfinite(path, finite.first_nonfinite(self.model, self.optimizer))
        extra = {"step": self.step, "scheduler": self._schedule_state()}
        checkpoint.save(path, self.model, self.optimizer, extra, self.rank, frozen=self._saves_frozen(),
                        device=self.device)

    def _saves_frozen(self) -> bool:
        """Whether checkpoints hold frozen parameters too: not with LoRA adapters or a frozen
        vision tower (they stay as loaded from the model directory)."""
        return not lora.is_peft(self.model) and not self.frozen_names

    def load_checkpoint(self, path: str) -> None:
        self._check_ready("load_checkpoint")
        extra = checkpoint.load(path, self.model, self.optimizer, self.rank, frozen=self._saves_frozen())
        self.step = extra.get("step", 0)
        self._load_schedule(extra.get("scheduler"))
