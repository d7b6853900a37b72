"""``MegatronWorker``: one rank of a role trained or scored with megatron-core (TP, PP, DP).

Contract: :class:`rlweave.interfaces.backend.TrainingWorker`, as the FSDP backend keeps it:
same model kinds (``causal_lm``, ``value``, ``reward``), same per-token conventions, same
token-weight convention for losses, same HF names in and out.

Rank layout: ``parallel: {tp, pp, dp}``; tensor-parallel ranks are adjacent, then pipeline
stages, and data-parallel replicas outermost (megatron order ``tp-cp-ep-pp-dp``), matching
the scheduler's data-parallel blocks of ``tp * pp`` consecutive ranks that all receive the
same shard. Every rank of a block returns the block's results (the last stage computes
them and broadcasts them to its pipeline peers).

Micro-batches are packed by default: one row of samples back to back, attention within each
sample (:mod:`.packed`), positions restarting at each sample; with ``use_packing: false`` they are
right-padded rows (causal mask plus key padding). Either is formed by a token budget (counted
over the padded rows when padded); the same count runs on every rank. Pipeline stages pass
activations and their gradients by point-to-point exchanges, in the order of
``options.pipeline_schedule`` (:mod:`.schedules`: ``1f1b`` by default, or ``sequential``).
Log-probabilities come from vocabulary-parallel logits (:mod:`.vocab`).

Training: each rank's AdamW updates its own shards; a bf16/fp16 model trains fp32 master copies
of them with fp32 AdamW state (``master_weights``, :mod:`.master`); with ``dp > 1`` the AdamW state
is sharded over the data-parallel ranks (``shard_optimizer``, :mod:`.zero`). Gradients are summed (not
averaged) over data-parallel replicas, so the gradient is that of the loss summed over all tokens of all
replicas (the token-weight convention); the norm counts every parameter once (tensor-parallel
shards summed, replicated tensors once), and a tied output weight on the last pipeline stage
shares its gradient with the embedding.

Mixture-of-experts models (Qwen3-MoE, :mod:`.moe`): ``parallel.ep`` splits the data-parallel
replicas into expert-parallel groups whose ranks each hold 1/ep of every layer's experts and
exchange tokens with all-to-all; expert gradients are summed over the replicas holding the same
experts (``dp / ep``) and their AdamW state is not sharded. Each micro-batch's loss includes the
router load-balancing loss (``options.moe_aux_loss_coef``) with the FSDP backend's token
weighting (:mod:`rlweave.backend_helpers.moe`), its gradient carried by the MoE layers' outputs
so that activation recomputation keeps it (:mod:`.aux_grad`); the step reports ``moe_aux_loss``
and the expert-load metrics. Router replay (:mod:`.replay`): every forward of a micro-batch with a
``routing`` token field (log-prob passes and training, activation recomputation included) uses
those experts, and ``compute_logprobs(with_routing=True)`` returns the experts its pass used.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from rlweave.backend_helpers.device import rank_device
from rlweave.backend_helpers.hf_dir import HFReader, export_config, write_hf
from rlweave.backend_helpers.training import TrainingSkeleton, model_dtype
from rlweave.data.batch import Batch
from rlweave.interfaces.backend import LossFn, merge_metric
from rlweave_backend_megatron import buckets, convert, model as mmodel, pipeline, schedules, vocab
from rlweave_backend_megatron.config import MegatronConfig

# megatron-core says so on every import when Apex / Transformer Engine are absent (the local specs
# are what this backend uses there) and on every TransformerConfig about a CUDA-graph default
for _msg in ("Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated"):
    warnings.filterwarnings("ignore", message=f".*{_msg}.*", category=UserWarning)


class MegatronWorker(TrainingSkeleton):
    """Trains and/or scores one tensor/pipeline shard of a model on one rank; the train step,
    optimizer and offload are :class:`~rlweave.backend_helpers.training.TrainingSkeleton`'s."""

    backend = "megatron"

    # ------------------------------------------------------------------ build
    def init_model(self) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        ctx = self.ctx
        self.cfg = ctx.options_as(MegatronConfig)
        self.kind = ctx.model.get("model_type", "causal_lm")
        if self.kind not in ("causal_lm", "value", "reward"):
            raise ValueError(f"megatron backend: unknown model_type {self.kind!r} (choose causal_lm, value, reward)")
        self.device = rank_device(ctx, "megatron")
        if self.device.type == "cpu":
            from rlweave_backend_megatron import cpu_shim

            # advice for CUDA's asynchronous gradient all-reduce; a CPU rank has no CUDA connections
            warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*", category=UserWarning)

            cpu_shim.apply()
        par = dict(ctx.parallel or {})
        self.tp, self.pp, self.ep = int(par.get("tp", 1)), int(par.get("pp", 1)), int(par.get("ep", 1))
        self.sp = bool(self.cfg.sequence_parallel)
        if self.sp and self.tp < 2:
            raise ValueError(f"megatron backend: role {ctx.role}: options.sequence_parallel needs parallel.tp > 1 "
                             f"(got tp={self.tp})")
        if self.world_size % (self.tp * self.pp):
            raise ValueError(f"megatron backend: role {ctx.role}: {self.world_size} ranks are not a multiple of "
                             f"tp*pp = {self.tp}*{self.pp}")
        self.dp = self.world_size // (self.tp * self.pp)
        if self.dp % self.ep:
            raise ValueError(f"megatron backend: role {ctx.role}: parallel.ep={self.ep} does not divide the "
                             f"data-parallel size {self.dp}")
        self.init_distributed(force=True)
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
                                     expert_model_parallel_size=self.ep, order="tp-cp-ep-pp-dp")
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()
        self.ep_rank = ps.get_expert_model_parallel_rank()
        seed = self.cfg.seed if self.cfg.seed is not None else ctx.seed
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        _, dtype = model_dtype(ctx, "megatron")
        path = ctx.model.get("path")
        if not path or not Path(path).is_dir():
            raise FileNotFoundError(f"megatron backend: model.path {path!r} is not a local directory")
        self.path = path
        hf_config = json.loads((Path(path) / "config.json").read_text())
        self.shape = convert.shape_from_config(hf_config, self.tp, self.cfg.make_vocab_size_divisible_by,
                                               f"{path}/config.json")
        self.impl = self._impl()
        kernel = ctx.kernel("moe_groupgemm") if self.shape.num_experts else None
        with HFReader(path) as read:
            self.model, self.layer_offset = mmodel.build(
                self.shape, self.kind, self.impl, self.tp, self.tp_rank, self.pp, self.pp_rank, dtype,
                self.device, read, seed, recompute=self.cfg.activation_checkpointing, sequence_parallel=self.sp,
                ep_rank=self.ep_rank, kernel=kernel)
        self.moe = None  # the router load-balancing loss of a mixture-of-experts model
        self.replay = None  # its router replay
        if self.shape.num_experts:
            from rlweave.backend_helpers.moe import AuxLoss

            from rlweave_backend_megatron import moe, replay

            self.mlps = moe.layers(self.model)
            coef = self.cfg.moe_aux_loss_coef
            if coef is None:
                coef = float(hf_config.get("router_aux_loss_coef", 0.0))
            self.moe = AuxLoss(len(self.mlps), self.shape.num_experts, self.shape.top_k, coef)
            spec = moe.Experts(self.shape.num_experts, self.shape.top_k, self.shape.moe_ffn, self.shape.norm_topk)
            self.replay = replay.Replay(self.mlps, spec, f"megatron backend: role {ctx.role}", self.pp, self.sp)
        self.stages = pipeline.Stages(self.model, self.pp_rank, self.pp, self.device, self.tp if self.sp else 1)
        self.step = 0
        self.offloaded = False
        self.stream_peak_bytes = 0
        self.masters = None
        self.owner: dict[str, int] | None = None  # sharded optimizer: parameter name -> owning data-parallel rank
        self.bucket_bytes = self.cfg.dp_bucket_bytes
        if ctx.optim is not None:
            if self.cfg.master_weights and dtype != torch.float32:
                from rlweave_backend_megatron.master import MasterWeights

                self.masters = MasterWeights(self.model)
            if self.cfg.shard_optimizer and self.dp > 1:
                self.owner = self._owners()
            self._build_optimizer(ctx.optim, [self.main(p) for n, p in self.model.named_parameters() if self.owns(n)])
        torch.manual_seed(seed + 1000 + self.rank)

    def _impl(self) -> str:
        choice = self.cfg.transformer_impl
        if self.shape.num_experts and choice == "auto":
            return "local"  # the MoE MLP (.moe) replaces the local spec's
        if choice == "auto":
            import importlib.util

            te = importlib.util.find_spec("transformer_engine") is not None
            return "transformer_engine" if te and self.device.type == "cuda" else "local"
        if choice == "transformer_engine" and self.device.type != "cuda":
            raise ValueError(f"megatron backend: roles.{self.ctx.role}.options.transformer_impl: transformer_engine "
                             "needs a CUDA device; use local (or auto) on CPU")
        return choice

    # ---------------------------------------------------------------- helpers
    def _mp_group(self):
        from megatron.core import parallel_state as ps

        return ps.get_model_parallel_group()

    def _tp_group(self):
        from megatron.core import parallel_state as ps

        return ps.get_tensor_model_parallel_group()

    def _dp_group(self):
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_group()

    def _plan(self, batch: Batch, budget: int) -> list[list[int]]:
        """Micro-batches within ``budget`` tokens: their tokens when packed, their padded rows'
        (samples x longest sample) otherwise; longest samples first."""
        lens = batch.seqlens.tolist()
        order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
        groups: list[list[int]] = []
        used = 0
        for i in order:  # longest first: a padded group's row width is its first sample's length
            if groups:
                need = used + lens[i] if self.cfg.use_packing else (len(groups[-1]) + 1) * lens[groups[-1][0]]
                if need <= budget:
                    groups[-1].append(i)
                    used += lens[i]
                    continue
            groups.append([i])
            used = lens[i]
        return [sorted(g) for g in groups]

    def _rows(self, mb: Batch | None) -> pipeline.Rows:
        """``mb`` laid out for the model: one packed row, or right-padded rows (``use_packing``)."""
        layout = pipeline.packed_row if self.cfg.use_packing else pipeline.padded
        return layout(mb, self.device, self.tp if self.sp else 1)

    def _last_outputs(self, raw: torch.Tensor, mb: Batch, flat: torch.Tensor, temperature: float,
                      with_entropy: bool) -> dict[str, torch.Tensor]:
        """Per-token results of a micro-batch from the last stage's output ``raw`` ``(B, L, ...)``."""
        cu = mb.cu_seqlens.to(self.device)
        total = int(cu[-1])
        first = torch.zeros(total, dtype=torch.bool, device=self.device)
        first[cu[:-1]] = True
        pred = (flat - 1).masked_fill(first, 0)  # the row position predicting each token
        if self.kind == "causal_lm":
            logits = raw.reshape(-1, raw.shape[-1])[pred]
            lp, ent = vocab.logprobs_entropy(logits, mb.token["input_ids"].to(self.device), self.shape.vocab,
                                             self.tp_rank, self._tp_group(), temperature, with_entropy)
            out = {"logprobs": lp.masked_fill(first, 0.0)}
            if ent is not None:
                out["entropy"] = ent.masked_fill(first, 0.0)
            return out
        heads = raw.reshape(-1).float()
        return {"values": heads[pred].masked_fill(first, 0.0), "scores": heads[flat[cu[1:] - 1]]}

    def _forward(self, mb: Batch | None, grad: bool, temperature: float = 1.0, with_entropy: bool = False,
                 record: bool = False):
        """Run one micro-batch (None: an empty one) through this rank's stage, replaying its
        routing field (MoE models); on the last stage return the per-token results (else None),
        with ``record`` its ``routing`` too (token order)."""
        rows = self._rows(mb)
        if self.replay is not None:
            self.replay.set(mb, rows, record)
        with torch.set_grad_enabled(grad):
            raw = self.stages.forward(rows)
        if not self.stages.last or mb is None:
            return raw, None
        res = self._last_outputs(raw, mb, rows.flat, temperature, with_entropy)
        if record:
            res["routing"] = self.replay.take(rows)
        return raw, res

    @torch.no_grad()
    def _per_token(self, batch: Batch, keys: tuple[str, ...], temperature: float = 1.0,
                   with_entropy: bool = False, with_routing: bool = False) -> dict[str, torch.Tensor]:
        """``keys`` per token (``scores``: per sample), in batch order; ``routing``: the experts
        of each token (MoE models, recorded)."""
        self._check_ready("forward")
        if self.replay is not None:
            self.replay.check(batch, record=with_routing)
        self.model.eval()
        groups = self._plan(batch, self._forward_budget()) if len(batch) else []
        n = self._max_over_ranks(len(groups))
        cu = batch.cu_seqlens.tolist()
        out = {k: torch.zeros(len(batch) if k == "scores" else batch.num_tokens, dtype=torch.float32) for k in keys}
        if with_routing:
            keys, out["routing"] = (*keys, "routing"), self.replay.unknown(batch.num_tokens)
        try:
            for i in range(n):
                mb = batch.select(groups[i]) if i < len(groups) else None
                _, res = self._forward(mb, grad=False, temperature=temperature, with_entropy=with_entropy,
                                       record=with_routing)
                if res is None:
                    continue
                for k in keys:
                    v = res[k].cpu() if k == "routing" else res[k].float().cpu()
                    if k == "scores":
                        out[k][torch.tensor(groups[i])] = v
                        continue
                    pos = 0
                    for j in groups[i]:
                        m = cu[j + 1] - cu[j]
                        out[k][cu[j]:cu[j + 1]] = v[pos:pos + m]
                        pos += m
        finally:
            if self.replay is not None:
                self.replay.clear()
        return self.stages.broadcast_from_last(out)

    # ------------------------------------------------------------- operations
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                         with_routing: bool = False) -> dict[str, torch.Tensor]:
        """See :class:`TrainingWorker`. A ``routing`` token field (MoE models) is replayed;
        ``with_routing``: also ``routing`` ``(T, layers, top_k)`` int16, the experts each token
        was routed to (those of the field where it has them), in token order, on every rank."""
        if self.kind != "causal_lm":
            raise NotImplementedError(f"megatron backend: role {self.ctx.role} is a {self.kind} model; no log-probs")
        if with_routing and self.replay is None:
            raise ValueError(f"megatron backend: role {self.ctx.role}: routing asked of a model without MoE layers")
        keys = ("logprobs", "entropy") if with_entropy else ("logprobs",)
        return self._per_token(batch, keys, temperature, with_entropy, with_routing)

    def compute_values(self, batch: Batch) -> torch.Tensor:
        if self.kind == "causal_lm":
            raise NotImplementedError(f"megatron backend: role {self.ctx.role} is a causal_lm; set model_type: value")
        return self._per_token(batch, ("values",))["values"]

    def compute_scores(self, batch: Batch) -> torch.Tensor:
        if self.kind == "causal_lm":
            raise NotImplementedError(f"megatron backend: role {self.ctx.role} is a causal_lm; set model_type: reward")
        return self._per_token(batch, ("scores",))["scores"]

    # ------------------------------------------------------------ train step
    def _accumulate(self, batch: Batch, groups: list[list[int]], n_micro: int, loss_fn: LossFn,
                    temperature: float, entropy: bool) -> tuple[float, dict[str, float]]:
        """Micro-batches through the pipeline stages in the order of ``options.pipeline_schedule``
        (:mod:`.schedules`); the last stage computes the loss (and its sum and metrics; other
        stages return 0 and none)."""
        loss_sum, metrics = 0.0, {}
        if self.replay is not None:
            self.replay.check(batch)
        micro = [batch.select(groups[i]) if i < len(groups) else None for i in range(n_micro)]
        if self.moe is not None:
            self.moe.begin_step(batch.num_tokens, self.device, self._dp_group())
            self.replay.tally.reset(self.device)
        rows: dict[int, pipeline.Rows] = {}

        def rows_of(i: int) -> pipeline.Rows:
            if i not in rows:
                micro[i] = self._on_device(micro[i]) if micro[i] is not None else None
                rows[i] = self._rows(micro[i])
            return rows[i]

        def forward(i: int, r: pipeline.Rows, h):
            nonlocal loss_sum
            if self.replay is not None:  # stays set for this micro-batch's backward (recomputation)
                self.replay.set(micro[i], r)
            keep = pipeline.layer_rows(r) if self.moe is not None else None
            grad_to = self._set_aux(keep if micro[i] is not None else None)  # set until the next micro-batch
            with self._router_logits() as logits:
                raw = self.stages.run(r, h)
            rows.pop(i, None)  # not needed again once run
            if not self.stages.last:
                return raw, None
            mb = micro[i]
            if mb is None:
                loss = raw.float().sum() * 0.0
            else:
                res = self._last_outputs(raw, mb, r.flat, temperature, entropy)
                loss, m = loss_fn(_Outputs(res.get("logprobs"), res.get("entropy"), res.get("values")), mb)
                for k, v in m.items():
                    metrics[k] = merge_metric(k, metrics.get(k), float(v))
            if self.moe is not None:  # the router load-balancing loss of the real tokens, token-weighted
                terms = self.moe.micro_value_and_grad([x.index_select(0, keep) for x in logits],
                                                      mb.num_tokens if mb else 0)
                if terms is not None:  # its value (no graph) here, its gradient by the layers' outputs
                    loss = loss + terms[0]
                    if grad_to is not None:
                        grad_to.probs_grad = terms[1]
            loss_sum += float(loss.detach())
            return raw, loss

        self.stages.wait_s = 0.0
        try:
            schedules.schedule(self.cfg.pipeline_schedule)(self.stages, n_micro, rows_of, forward)
        finally:
            if self.replay is not None:
                self.replay.clear()
            self._set_aux(None)
        if self.pp > 1:  # the last stage's time waiting for its neighbour (the most over replicas)
            metrics["pipeline_wait_s_max"] = self.stages.wait_s
        return loss_sum, metrics

    def _reports_metrics(self) -> bool:
        return self.stages.last and self.tp_rank == 0

    def _router_logits(self):
        """Context collecting the router logits of the MoE layers' forwards inside it (a list;
        nothing for a dense model)."""
        import contextlib

        if self.moe is None:
            return contextlib.nullcontext([])
        from rlweave_backend_megatron import moe

        return moe.capture(self.mlps)

    def _set_aux(self, rows: torch.Tensor | None):
        """The MoE layers' load-balancing gradient attachment (:mod:`.aux_grad`) of the real-token
        ``rows`` of the next micro-batch (None, a dense model or coefficient 0: none); returns it."""
        if self.moe is None:
            return None
        from rlweave_backend_megatron import aux_grad

        return aux_grad.set_aux(self.mlps, rows if self.moe.coef else None)

    def _step_metrics(self) -> tuple[dict[str, float], dict[str, float]]:
        """``moe_aux_loss`` and the expert-load metrics of a mixture-of-experts model, and with
        router replay ``moe_replay_changed_frac`` (the share of the step's replayed routing
        decisions that differ from the routers' own)."""
        if self.moe is None:
            return {}, {}
        per_rank, global_ = self.moe.step_metrics(self._dp_group())
        return per_rank, {**global_, **self.replay.tally.metrics(self._dp_group())}

    def _owners(self) -> dict[str, int]:
        """The sharded optimizer's plan (:mod:`.zero`): a tied embedding and its copy on the last
        stage on data-parallel rank 0, the rest balanced by size."""
        from rlweave_backend_megatron import zero

        sizes = {n: p.numel() for n, p in self.model.named_parameters() if p.requires_grad and not convert.is_expert(n)}
        if len(sizes) < self.dp:
            raise ValueError(f"megatron backend: role {self.ctx.role}: options.shard_optimizer: this pipeline stage has "
                             f"{len(sizes)} trainable tensors for {self.dp} data-parallel ranks; set shard_optimizer: "
                             "false")
        tied = ("embedding.word_embeddings.weight", "output_layer.weight") if self.stages.tied else ()
        return zero.owners(sizes, self.dp, {n: 0 for n in sizes if self.global_name(n) in tied})

    def owns(self, name: str) -> bool:
        """Whether this rank's optimizer steps parameter ``name`` (every one unless sharded;
        experts always: they are this rank's own)."""
        return self.owner is None or convert.is_expert(name) or self.owner.get(name) == self.dp_rank

    def main(self, p: torch.nn.Parameter) -> torch.nn.Parameter:
        """What the optimizer, the gradient reduction, clipping and checkpoints work on for the
        model parameter ``p``: its fp32 master (:mod:`.master`) or ``p`` itself."""
        return self.masters.main(p) if self.masters is not None else p

    def _reduce_grads(self) -> None:
        """Sum the query/key norms' gradients (and with sequence parallelism the norms') over
        tensor-parallel ranks and every gradient over data-parallel replicas; share the tied
        output weight's with the embedding."""
        params = [self.main(p) for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.tp > 1:  # replicated, each rank's gradient from its own heads or its own slice of the sequence
            for name, p in self.model.named_parameters():
                if p.requires_grad and (convert.tp_summed(name) or getattr(p, "sequence_parallel", False)):
                    dist.all_reduce(self.main(p).grad, group=self._tp_group())
        if self.dp > 1:  # summed on every replica, or on the parameter's owner (sharded optimizer), in buckets
            group = self._dp_group()
            grads = {n: self.main(p).grad for n, p in self.model.named_parameters()
                     if p.requires_grad and not convert.is_expert(n)}
            experts = [self.main(p).grad for n, p in self.model.named_parameters()
                       if p.requires_grad and convert.is_expert(n)]
            if experts and self.dp > self.ep:  # over the replicas holding the same experts
                from megatron.core import parallel_state as ps

                egroup = ps.get_expert_data_parallel_group()
                buckets.coalesced(experts, lambda f: dist.all_reduce(f, group=egroup), self.bucket_bytes)
            if self.owner is None:
                buckets.coalesced(grads.values(), lambda f: dist.all_reduce(f, group=group), self.bucket_bytes)
            else:
                for r in range(self.dp):
                    dst = dist.get_global_rank(group, r)
                    buckets.coalesced((g for n, g in grads.items() if self.owner[n] == r),
                                      lambda f, dst=dst: dist.reduce(f, dst=dst, group=group), self.bucket_bytes)
        self.stages.share_embedding_grads(self.main)

    def _clip(self) -> float:
        """Data-parallel reduction (:meth:`_reduce_grads`), then the norm over all ranks, each
        value counted once, and clipping."""
        self._reduce_grads()
        sq = torch.zeros(1, dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            g = self.main(p).grad
            if g is None or not self._counted(name, p):
                continue
            sq += g.detach().double().pow(2).sum()
        # every rank's share: replicas' copies counted on one of them (a sharded one's on its owner)
        dist.all_reduce(sq, group=self._mp_group() if self.owner is None and self.ep == 1 else None)
        norm = float(sq.sqrt())
        max_norm = float(self.optim_cfg.grad_clip or 0.0)
        if max_norm > 0 and math.isfinite(norm):
            coef = max_norm / (norm + 1e-6)
            if coef < 1.0:
                for p in self.model.parameters():
                    g = self.main(p).grad
                    if g is not None:
                        g.mul_(coef)
        return norm

    def _update(self, loss_sum: float) -> tuple[float, bool]:
        """The skeleton's update; then the parameters take their masters' new values (if any)."""
        norm, skipped = super()._update(loss_sum)
        if self.owner is not None:  # the optimizer zeroed only the gradients it owns
            for p in self.model.parameters():
                self.main(p).grad = None
            if not skipped:
                self._from_owners()
        if self.masters is not None and not skipped:
            self.masters.copy_to_model()
        return norm, skipped

    @torch.no_grad()
    def _from_owners(self) -> None:
        """Each parameter (its master, if any) from the data-parallel rank that stepped it, in buckets."""
        group = self._dp_group()
        for r in range(self.dp):
            src = dist.get_global_rank(group, r)
            buckets.coalesced((self.main(p).data for n, p in self.model.named_parameters()
                               if p.requires_grad and self.owner.get(n) == r),
                              lambda f, src=src: dist.broadcast(f, src=src, group=group), self.bucket_bytes)

    def _state_bytes(self) -> tuple[int, int]:
        pb, ob = super()._state_bytes()
        return pb, ob + (self.masters.nbytes() if self.masters is not None else 0)

    def _move_extra_state(self, device) -> None:
        if self.masters is not None:
            self.masters.to(device)

    def _counted(self, name: str, p: torch.nn.Parameter) -> bool:
        """Whether this rank counts ``p`` in the global norm: each value once over the
        model-parallel group and, where the sum runs over all ranks (a sharded optimizer, expert
        parallelism), once over the data-parallel replicas: on its owner, experts on the first
        replica of their expert-parallel group, the rest on data-parallel rank 0."""
        if self.stages.is_tied_copy(name):
            return False
        if convert.split_kind(name) == "none" and self.tp_rank != 0:
            return False
        if convert.is_expert(name):
            return self.dp_rank < self.ep
        if self.owner is not None:
            return self.owns(name)
        return self.ep == 1 or self.dp_rank == 0

    # ------------------------------------------------------------------ state
    def global_name(self, name: str) -> str:
        """The global full-tensor name (:mod:`.convert`) of this stage's parameter ``name``."""
        return convert.canonical(mmodel._stage_name(name, self.layer_offset))

    def _full_names(self) -> list[str]:
        return convert.full_names(self.shape, self.kind)

    def _owner_stage(self, name: str) -> int:
        per = self.shape.layers // self.pp
        if name.startswith("embedding."):
            return 0
        m = convert._LAYER.match(name)
        return int(m.group(1)) // per if m else self.pp - 1

    def _local_param(self, gname: str) -> torch.Tensor:
        local = gname
        m = convert._LAYER.match(gname)
        if m:
            local = f"decoder.layers.{int(m.group(1)) - self.layer_offset}.{m.group(2)}"
        if gname == convert.HEAD + ".weight":
            local = "output_layer.score.weight"
        params = dict(self.model.named_parameters())
        if local not in params and self.impl == "transformer_engine":
            for te, lo in convert._TE_ALIASES.items():
                if local.endswith(lo):
                    local = local[: -len(lo)] + te
        return params[local]

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full megatron tensors in :func:`.convert.full_names` order; all ranks iterate, the
        first replica's ranks gather, global rank 0 yields (others yield nothing). Only one
        gathered tensor is alive on a rank at a time (``stream_peak_bytes`` records the most)."""
        self._check_ready("named_weights")
        if self.dp_rank >= self.ep:  # the first replica (with expert parallelism: its expert-parallel group)
            return
        self.stream_peak_bytes = 0
        for gname in self._full_names():
            expert = convert.is_expert(gname)
            if self.dp_rank != 0 and not expert:
                continue
            stage = self._owner_stage(gname)
            full = None
            if stage == self.pp_rank:
                shard = self._local_param(gname).detach()
                if expert and self.ep > 1:
                    shard = self._gather_experts(shard)
                    if self.dp_rank != 0:
                        continue
                shards = pipeline.gather_tp(shard, self.tp, self.tp_rank, self._tp_group())
                if shards is not None:
                    full = convert.merge(gname, shards)
                    del shards
            full = self.stages.to_first(full, stage, self.tp_rank)
            if full is not None:
                self.stream_peak_bytes = max(self.stream_peak_bytes, 2 * full.numel() * full.element_size())
                if self.rank == 0:
                    yield gname, full
            del full

    def _gather_experts(self, shard: torch.Tensor) -> torch.Tensor:
        """Every expert of a stacked expert tensor, from the ranks of this expert-parallel group."""
        from megatron.core import parallel_state as ps

        parts = [torch.empty_like(shard) for _ in range(self.ep)]
        dist.all_gather(parts, shard.contiguous(), group=ps.get_expert_model_parallel_group())
        return torch.cat(parts)

    def named_weights(self, dtype: torch.dtype | None = None, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors, one full megatron tensor at a time; rank 0 yields."""
        for gname, full in self.full_tensors():
            for hf_name, t in convert.hf_from_full(gname, full, self.shape):
                to = dtype if dtype is not None and t.is_floating_point() else t.dtype
                yield hf_name, t.to(device=device, dtype=to, copy=True).contiguous()

    def save_hf(self, path: str) -> None:
        self._check_ready("save_hf")
        items = self.named_weights()
        if self.rank == 0:
            from transformers import AutoConfig

            hf_cfg = AutoConfig.from_pretrained(self.path, local_files_only=True)
            dtype = next(iter(self.model.parameters())).dtype
            cfg = export_config(hf_cfg, self.kind, dtype)
            tok = self.ctx.model.get("tokenizer") or self.path
            write_hf(path, items, cfg, self.kind, tok, self.cfg.hf_shard_bytes)
        else:
            for _ in items:
                pass
        dist.barrier()

    def save_checkpoint(self, path: str) -> None:
        self._check_ready("save_checkpoint")
        from rlweave_backend_megatron import checkpoint

        checkpoint.save(self, path)

    def load_checkpoint(self, path: str) -> None:
        self._check_ready("load_checkpoint")
        from rlweave_backend_megatron import checkpoint

        checkpoint.load(self, path)

    def shutdown(self) -> None:
        try:
            from megatron.core import parallel_state as ps

            if ps.model_parallel_is_initialized():
                ps.destroy_model_parallel()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        super().shutdown()


class _Outputs:
    """:class:`rlweave.interfaces.backend.ModelOutputs` of one micro-batch."""

    def __init__(self, logprobs, entropy, values):
        self.logprobs, self.entropy, self.values = logprobs, entropy, values

