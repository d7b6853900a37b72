"""``FSDPWorker``: one rank of a role trained or scored with torch FSDP2.

Contract: :class:`rlweave.interfaces.backend.TrainingWorker`. Every public operation is
called on all ranks of the role at once and runs the same number of forward passes on
every rank (the micro-batch count is all-reduced to the maximum; ranks with fewer run empty
micro-batches that add zero loss), because FSDP2's all-gathers and reduce-scatters must
match across ranks.

Micro-batches are formed by a token budget (``max_tokens_per_micro_batch``) and, with
``use_packing``, laid out as one row with per-sample positions and exact varlen attention
(:mod:`.attention`). With ``share_prompts`` (and rlweave's varlen attention), samples of a
micro-batch with the same prompt carry it once (:mod:`.prefix`), and micro-batches keep
such groups together; per-token results are returned in the unshared layout.
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
expert-load metrics; weights leave in checkpoint names (:mod:`.moe_layout`).

LoRA (``ctx.lora``, :mod:`.lora`): PEFT adapters wrap the targeted linear layers before sharding;
only they (and ``modules_to_save``) train, sit in the optimizer and in checkpoints; weights leave
merged under the base model's names (``named_weights``, ``save_hf``); ``save_adapter`` writes the
PEFT adapter directory and ``compute_logprobs(adapters=False)`` gives the base model's log-probs.

Model kinds (``ctx.model['model_type']``): ``causal_lm`` (log-probs, entropy), ``value``
(prediction-aligned per-token values: ``values[t]`` is read at ``t-1``, 0 at first tokens)
and ``reward`` (score at each sample's last token). See :mod:`.modeling` and
:mod:`.hf_export` for how heads are stored.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

from rlweave.backend_helpers import finite
from rlweave.backend_helpers.device import rank_device
from rlweave.backend_helpers.training import TrainingSkeleton, model_dtype
from rlweave.data.batch import Batch
from rlweave.interfaces.backend import LossFn, merge_metric
from rlweave_backend_fsdp import attention, checkpoint, checks, hf_export, lora, micro, modeling, moe, parallelize, prefix
from rlweave_backend_fsdp import sequence_parallel as seqpar
from rlweave_backend_fsdp.config import FSDPConfig
from rlweave_backend_fsdp.outputs import Outputs, Window, last_token_scores, token_logprobs, token_values


class FSDPWorker(TrainingSkeleton):
    """Trains and/or scores one model shard on one rank (see module docstring); the train step,
    optimizer and offload are :class:`~rlweave.backend_helpers.training.TrainingSkeleton`'s."""

    backend = "fsdp"
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
        model = modeling.load_model(ctx.model, self.attn_impl, param_dtype, seed)
        # the steps of parallelize.py, in its order
        blocks = moe.find_blocks(model)
        self._refuse(checks.moe_problems(sp, blocks[0].num_experts if blocks else None))
        self.moe_kernel = parallelize.apply_moe_kernel(model, blocks, ctx, self.device.type, self.rank)
        self._refuse(parallelize.apply_sequence_parallel(model, sp))
        self.choices = parallelize.apply_cpu_paths(model, self.cfg, self.device.type, bf16, self.world_size,
                                                   dtype_name=dtype_name, role=ctx.role, rank=self.rank)
        parallelize.apply_activation_checkpointing(model, self.cfg.activation_checkpointing)
        layers = modeling.decoder_layers(model)
        model = parallelize.apply_lora(model, ctx.lora, self.kind, ctx.role)
        parallelize.apply_compile(layers, self.cfg.compile, self.choices.compile_scope)
        parallelize.apply_fsdp(model, layers, self.device.type, self.world_size, self.cfg.mixed_precision,
                               self.cfg.reshard_after_forward)
        self.model = model
        coef = self.cfg.moe_aux_loss_coef
        if coef is None:
            coef = float(getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0)
        self.moe_state = moe.MoETraining(blocks, coef) if blocks else None
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

    # ---------------------------------------------------------------- helpers
    def _sharing(self, batch: Batch) -> bool:
        return (self.cfg.share_prompts and self.packing and self.attn_impl == attention.NAME
                and "prompt_len" in batch.sample and len(batch) > 1)

    def _plan(self, batch: Batch, budget: int) -> list[list[int]]:
        """Micro-batches of ``batch`` within ``budget`` tokens (shared-row tokens when sharing)."""
        if not len(batch):
            return []
        if self._sharing(batch):
            return prefix.plan_units(batch.token["input_ids"], batch.cu_seqlens, batch.sample["prompt_len"].tolist(),
                                     budget)
        return micro.plan(batch.seqlens.tolist(), budget)

    def _shared(self, mb: Batch) -> prefix.SharedRow | None:
        if not self._sharing(mb):
            return None
        return prefix.share(mb.token["input_ids"].cpu(), mb.cu_seqlens, mb.sample["prompt_len"].tolist())

    def _raw(self, ids: torch.Tensor, cu: torch.Tensor,
             shared: prefix.SharedRow | None = None) -> tuple[torch.Tensor, Window | None]:
        """Model output per packed token: logits ``(T, V)`` or head values ``(T,)``; with
        ``shared``, per position of its row ``(T', ...)``. With sequence parallelism, only the
        positions of this rank's window (returned; None without)."""
        if self.sp is not None:
            return self._raw_sp(ids, cu, shared)
        flat = None  # padded rows: the flat index of each real token
        if shared is not None:
            kw = {"input_ids": shared.input_ids.view(1, -1).to(self.device),
                  "position_ids": shared.position_ids.view(1, -1).to(self.device),
                  "rlweave_plan": shared.plan, "attention_mask": None}
        elif self.packing:
            # no mask: varlen kernels build none (attention.padding_mask, FA2's); sdpa builds a block mask
            kw = micro.packed_inputs(ids, cu, self.device)
        else:
            kw, flat = micro.padded_inputs(ids, cu, self.device)
        out = self._forward(**kw)
        if self.moe_state is not None:
            self.moe_state.tap.keep_rows(flat)
        raw = out if self.kind != "causal_lm" else out.logits
        # squeeze, not raw[0]: the backward of a select allocates and zero-fills a (1, T, V) gradient
        return (raw.squeeze(0) if flat is None else raw.reshape(-1, *raw.shape[2:])[flat]), None

    def _raw_sp(self, ids: torch.Tensor, cu: torch.Tensor,
                shared: prefix.SharedRow | None) -> tuple[torch.Tensor, Window]:
        """:meth:`_raw` on this rank's slice of the (padded) row, attention over the whole row."""
        if shared is not None:
            row_ids, row_pos = shared.input_ids, shared.position_ids
        else:
            row_ids, row_pos = ids.cpu(), micro.positions(cu)
        part = seqpar.shard(row_ids, row_pos, self.sp)
        total = int(row_ids.numel())
        kw = {"input_ids": part.input_ids.view(1, -1).to(self.device),
              "position_ids": part.position_ids.view(1, -1).to(self.device),
              "attention_mask": None, "rlweave_sp": self.sp}
        if shared is not None:
            kw["rlweave_plan"] = attention.padded_plan(shared.plan, total, part.pad)
        else:
            bounds = cu.tolist() + ([total + part.pad] if part.pad else [])
            kw.update(micro.varlen_kwargs(torch.tensor(bounds), self.device))
        out = self._forward(**kw)
        raw = out if self.kind != "causal_lm" else out.logits
        return raw.squeeze(0), Window(part.lo, part.n, lambda x: seqpar.combine(x, self.sp))

    def _outputs(self, mb: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Outputs:
        ids = mb.token["input_ids"].to(self.device)
        shared = self._shared(mb)
        raw, window = self._raw(ids, mb.cu_seqlens, shared)
        rows = shared.tok_row if shared is not None else None
        if self.kind == "causal_lm":
            lp, ent = token_logprobs(raw, ids, mb.cu_seqlens, temperature, with_entropy, rows,
                                     compiled=self.choices.compiled_logprobs, window=window)
            return Outputs(logprobs=lp, entropy=ent)
        return Outputs(values=token_values(raw, mb.cu_seqlens, rows, window))

    def _dummy_loss(self) -> torch.Tensor:
        """An empty micro-batch: a 2-token forward whose loss is exactly zero."""
        raw, _ = self._raw(torch.zeros(2, dtype=torch.long, device=self.device), torch.tensor([0, 2]))
        return raw.float().sum() * 0.0

    @torch.no_grad()
    def _per_token(self, batch: Batch, fn) -> list[tuple[list[int], Any]]:
        """Run ``fn(micro_batch)`` over budgeted micro-batches (same count on all ranks)."""
        self._check_ready("forward")
        self.model.eval()
        groups = self._plan(batch, self._forward_budget())
        n = self._max_over_ranks(len(groups))
        results = []
        for i in range(n):
            if i < len(groups):
                results.append((groups[i], fn(batch.select(groups[i]))))
            else:
                self._dummy_loss()
        return results

    def _scatter_tokens(self, batch: Batch, results, key: str) -> torch.Tensor:
        out = torch.zeros(batch.num_tokens, dtype=torch.float32)
        cu = batch.cu_seqlens.tolist()
        for group, vals in results:
            v = vals[key].float().cpu()
            pos = 0
            for i in group:
                n = cu[i + 1] - cu[i]
                out[cu[i] : cu[i + 1]] = v[pos : pos + n]
                pos += n
        return out

    # ------------------------------------------------------------- operations
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                         adapters: bool = True) -> dict[str, torch.Tensor]:
        """See :class:`TrainingWorker`; ``adapters=False`` (a role with LoRA adapters): the base
        model's log-probs, with every adapter and ``modules_to_save`` copy switched off."""
        if self.kind != "causal_lm":
            raise NotImplementedError(f"{self.backend} backend: role {self.ctx.role} is a {self.kind} model; no log-probs")
        if not adapters:
            if not lora.is_peft(self.model):
                raise ValueError(f"{self.backend} backend: role {self.ctx.role} has no LoRA adapters to disable "
                                 f"(roles.{self.ctx.role}.lora is not set)")
            with lora.adapters_disabled(self.model):
                return self.compute_logprobs(batch, temperature, with_entropy)

        def fn(mb: Batch):
            o = self._outputs(mb, temperature, with_entropy)
            return {"logprobs": o.logprobs, "entropy": o.entropy}

        res = self._per_token(batch, fn)
        out = {"logprobs": self._scatter_tokens(batch, res, "logprobs")}
        if with_entropy:
            out["entropy"] = self._scatter_tokens(batch, res, "entropy")
        return out

    def compute_values(self, batch: Batch) -> torch.Tensor:
        if self.kind == "causal_lm":
            raise NotImplementedError(f"{self.backend} backend: role {self.ctx.role} is a causal_lm; set model_type: value")
        res = self._per_token(batch, lambda mb: {"values": self._outputs(mb).values})
        return self._scatter_tokens(batch, res, "values")

    def compute_scores(self, batch: Batch) -> torch.Tensor:
        if self.kind == "causal_lm":
            raise NotImplementedError(f"{self.backend} backend: role {self.ctx.role} is a causal_lm; set model_type: reward")

        def fn(mb: Batch):
            ids = mb.token["input_ids"].to(self.device)
            shared = self._shared(mb)
            rows = shared.tok_row if shared is not None else None
            raw, window = self._raw(ids, mb.cu_seqlens, shared)
            return last_token_scores(raw, mb.cu_seqlens, rows, window).cpu()

        out = torch.zeros(len(batch), dtype=torch.float32)
        for group, scores in self._per_token(batch, fn):
            out[torch.tensor(group, dtype=torch.long)] = scores
        return out

    # ------------------------------------------------------------ train step
    def _accumulate(self, batch: Batch, groups: list[list[int]], n_micro: int, loss_fn: LossFn,
                    temperature: float, entropy: bool) -> tuple[float, dict[str, float]]:
        """Micro-batch losses are scaled by the number of ranks before backward (undoing FSDP's
        gradient averaging). For a mixture-of-experts model each micro-batch's loss includes the
        weighted router load-balancing loss, whose token-weighted mean is ``moe_aux_loss``;
        ``moe_load_max_over_mean``, ``moe_load_min_over_mean`` and ``moe_tokens_per_expert_max``
        describe the tokens each expert received over all ranks (:func:`.moe.load_metrics`)."""
        loss_sum, metrics = 0.0, {}
        if self.moe_state is not None:
            self.moe_state.begin_step(batch.num_tokens, self.device)
        for i in range(n_micro):
            tokens = 0
            with self.moe_state.tap.capture() if self.moe_state is not None else contextlib.nullcontext():
                if i < len(groups):
                    mb = self._on_device(batch.select(groups[i]))
                    tokens = mb.num_tokens
                    loss, m = loss_fn(self._outputs(mb, temperature, with_entropy=entropy), mb)
                    for k, v in m.items():
                        metrics[k] = merge_metric(k, metrics.get(k), float(v))
                else:
                    loss = self._dummy_loss()
            aux = self.moe_state.micro_loss(tokens) if self.moe_state is not None else None
            if aux is not None:  # the router load-balancing loss, token-weighted (see .moe)
                loss = loss + aux
            self._backward(loss * self.world_size)
            loss_sum += float(loss.detach())
        return loss_sum, metrics

    def _forward(self, **kw: Any):
        """The model's forward on keyword inputs (a subclass may run it through a wrapper)."""
        return self.model(**kw, use_cache=False)

    def _backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's (rank-scaled) loss, accumulating into the gradients."""
        loss.backward()

    def _step_metrics(self) -> tuple[dict[str, float], dict[str, float]]:
        return self.moe_state.step_metrics(self.device) if self.moe_state is not None else ({}, {})

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
        yield from hf_export.stream_full(self.model, self.rank, self.skip_names, dtype=dtype, device=device)

    def _export_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What ``save_hf`` writes: HF-named full tensors as stored, rank 0 yields (all ranks iterate)."""
        return hf_export.stream_full(self.model, self.rank, self.skip_names)

    def save_hf(self, path: str) -> None:
        self._check_ready("save_hf")
        items = self._export_items()
        if self.rank == 0:
            dtype = next(iter(lora.base_of(self.model).parameters())).dtype
            cfg = hf_export.export_config(self.model, self.kind, dtype)
            tok = self.ctx.model.get("tokenizer") or self.ctx.model.get("path")
            hf_export.write_hf(path, items, cfg, self.kind, tok, self.cfg.hf_shard_bytes)
        else:
            for _ in items:
                pass
        dist.barrier()

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
        checkpoint.save(path, self.model, self.optimizer, extra, self.rank, frozen=not lora.is_peft(self.model))

    def load_checkpoint(self, path: str) -> None:
        self._check_ready("load_checkpoint")
        extra = checkpoint.load(path, self.model, self.optimizer, self.rank, frozen=not lora.is_peft(self.model))
        self.step = extra.get("step", 0)
        self._load_schedule(extra.get("scheduler"))
