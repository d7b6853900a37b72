"""``HFModelWorker``: the part of a training worker that runs a Hugging Face model, shared by
the backends that train one (FSDP, DeepSpeed): what a micro-batch looks like to the model and
how its outputs become per-token results.

* micro-batches by token budget (:mod:`.micro`), or, with ``share_prompts`` and rlweave's
  varlen attention, by whole groups of samples sharing a prompt (:mod:`.prefix`), whose
  prompt the packed row then carries once;
* one forward per micro-batch: a packed row with exact varlen attention (:mod:`.attention`;
  ``use_packing``), else right-padded rows;
* the heads' results under the prediction convention (:mod:`.outputs`): log-probs and
  entropy of a ``causal_lm`` (:mod:`.logprob`), values of a ``value`` model, the last-token
  score of a ``reward`` model (:mod:`.heads`);
* the no-grad operations (``compute_logprobs``, ``compute_values``, ``compute_scores``) and
  the train step's forward/backward (``_accumulate``), with the same number of forwards on
  every rank (empty micro-batches run a 2-token forward of zero loss), as sharded
  collectives need;
* ``save_hf``: a Hugging Face directory from the backend's full-tensor stream;
* MoE router replay (:mod:`rlweave.backend_helpers.router_replay`), when the backend set
  ``router``: every forward of a micro-batch with a ``routing`` token field runs with those
  experts (its row layout mapped from token order), and ``compute_logprobs(with_routing=True)``
  returns the routing its forward chose, in token order.

Gradients follow the token-weight convention: micro-batch losses are summed and multiplied by
the number of ranks before backward (undoing the data-parallel gradient averaging of FSDP and
DeepSpeed), so the gradient is that of the loss summed over all tokens of all ranks.

A subclass (one backend) sets, in ``init_model``, besides :class:`TrainingSkeleton`'s
attributes: ``cfg`` with ``use_packing`` and ``share_prompts``, ``attn_impl`` (a
transformers attention implementation name, :func:`.attention.choose`), ``packing``,
``choices`` (:class:`.cpu.DeviceChoices`) and ``skip_names`` (state-dict names left out of
exports: a tied LM head). It implements :meth:`HFModelWorker._export_items` and the
skeleton's abstract methods this class leaves open, and may override the hooks below
(the forward and backward through an engine, per-micro-batch extras such as a router loss,
LoRA adapters).
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Iterator
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist

from rlweave.backend_helpers import hf_dir, router_replay
from rlweave.backend_helpers.hf_model import attention, micro, prefix
from rlweave.backend_helpers.hf_model import vision as vision_forward
from rlweave.backend_helpers.hf_model.cpu import DeviceChoices
from rlweave.backend_helpers.hf_model.outputs import Outputs, Window, last_token_scores, token_logprobs, token_values
from rlweave.backend_helpers.training import TrainingSkeleton
from rlweave.data.batch import Batch
from rlweave.interfaces.backend import LossFn, merge_metric


class HFModelWorker(TrainingSkeleton):
    """A training worker whose model is a Hugging Face model (see the module docstring)."""

    attn_impl: str
    packing: bool
    choices: DeviceChoices
    skip_names: set[str]
    router: router_replay.RouterReplay | None = None  # set by a backend for an MoE model
    _routing_out: torch.Tensor | None = None  # the routing the last recording forward chose, token order

    # ---------------------------------------------------------- backend hooks
    def _forward(self, **kw: Any) -> Any:
        """The model's forward on keyword inputs (a backend may run it through its engine)."""
        return self.model(**kw, use_cache=False)

    def _backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's (rank-scaled) loss, accumulating into the gradients."""
        loss.backward()

    def _after_forward(self, flat: torch.Tensor | None) -> None:
        """Called after each forward of :meth:`_raw` with the flat index of each real token in
        the padded grid (None: a packed or shared row); default nothing."""

    def _begin_accumulate(self, batch: Batch) -> None:
        """Called once per train step before its micro-batches; default nothing."""

    def _micro_scope(self) -> ContextManager[Any]:
        """Context each training micro-batch's forward runs in; default none."""
        return contextlib.nullcontext()

    def _extra_loss(self, tokens: int) -> torch.Tensor | None:
        """A loss term added to a training micro-batch of ``tokens`` tokens (0: an empty one)
        after its forward and before backward; default None (nothing)."""
        return None

    def _adapters_off(self) -> ContextManager[Any]:
        """Context in which the model runs without its LoRA adapters; ValueError here (a
        backend without adapters)."""
        raise ValueError(f"{self.backend} backend: role {self.ctx.role} has no LoRA adapters to disable "
                         f"(roles.{self.ctx.role}.lora is not set)")

    def _base_model(self) -> torch.nn.Module:
        """The HF model under any adapter wrapper (its ``config`` and dtype are exported)."""
        return self.model

    @abstractmethod
    def _export_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What ``save_hf`` writes: HF-named full tensors as stored; every rank iterates, rank 0's
        yields them."""

    # ------------------------------------------------------------- one forward
    def _sharing(self, batch: Batch) -> bool:
        return (self.cfg.share_prompts and self.packing and self.attn_impl == attention.NAME
                and "prompt_len" in batch.sample and len(batch) > 1 and self._vision() is None)

    def _vision(self) -> vision_forward.VisionForward | None:
        """The vision-language forward of this model (None: a text model), found on first use."""
        if "_vision_fwd" not in self.__dict__:
            self._vision_fwd = vision_forward.for_model(self._base_model())
            if self._vision_fwd is not None and not self.packing:
                raise ValueError(f"{self.backend} backend: role {self.ctx.role}: a vision-language model runs on "
                                 "packed rows only; set use_packing: true")
        return self._vision_fwd

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

    def _raw(self, ids: torch.Tensor, cu: torch.Tensor, shared: prefix.SharedRow | None = None,
             routing: torch.Tensor | None = None, record: bool = False,
             mm: list | None = None) -> tuple[torch.Tensor, Window | None]:
        """Model output per packed token: logits ``(T, V)`` or head values ``(T,)``; with
        ``shared``, per position of its row ``(T', ...)``. Returns it and the window of row
        positions it covers (None: all; a backend splitting rows over ranks returns its own).
        ``routing`` (token order) is replayed and, with ``record``, the routing chosen is kept
        for :meth:`_outputs` (MoE models: :meth:`_route`). ``mm``: each sample's vision inputs
        (vision-language models, :mod:`.vision`; their vision tower runs on every call)."""
        flat = None  # padded rows: the flat index of each real token
        if shared is not None:
            kw = {"input_ids": shared.input_ids.view(1, -1).to(self.device),
                  "position_ids": shared.position_ids.view(1, -1).to(self.device),
                  "rlweave_plan": shared.plan, "attention_mask": None}
            index, n_rows = shared.tok_row, int(shared.input_ids.numel())
        elif self.packing:
            # no mask: varlen kernels build none (attention.padding_mask, FA2's); sdpa builds a block mask
            kw = micro.packed_inputs(ids, cu, self.device)
            index, n_rows = None, int(ids.numel())
            vis = self._vision()
            if vis is not None:
                kw.update(vis.inputs(ids, cu, mm or [], self.device))
        else:
            kw, flat = micro.padded_inputs(ids, cu, self.device)
            index, n_rows = flat, int(kw["input_ids"].numel())
        self._route(routing, record, n_rows, index)
        out = self._forward(**kw)
        self._after_forward(flat)
        if record and self.router is not None:
            self._routing_out = router_replay.from_rows(self.router.take(), index)
        raw = out if self.kind != "causal_lm" else out.logits
        # squeeze, not raw[0]: the backward of a select allocates and zero-fills a (1, T, V) gradient
        return (raw.squeeze(0) if flat is None else raw.reshape(-1, *raw.shape[2:])[flat]), None

    def _route(self, routing: torch.Tensor | None, record: bool, n_rows: int, index: torch.Tensor | None) -> None:
        """Set the next forward's routing (token-order ``routing`` laid out on its ``n_rows`` row
        positions, ``index``: :func:`.router_replay.to_rows`) and recording; a dense model
        ignores a routing field and refuses to record."""
        if self.router is None:
            if record:
                raise ValueError(f"{self.backend} backend: role {self.ctx.role}: routing asked of a model without "
                                 "MoE layers")
            return
        rows = None
        if routing is not None:
            self.router.check(routing, f"{self.backend} backend: role {self.ctx.role}")
            rows = router_replay.to_rows(routing.to(self.device), n_rows, index)
        self.router.set(rows, record)

    def _outputs(self, mb: Batch, temperature: float = 1.0, with_entropy: bool = False,
                 record: bool = False) -> Outputs:
        """The micro-batch's per-token outputs; its ``routing`` token field is replayed, and with
        ``record`` the routing chosen is returned too (``Outputs.routing``, token order)."""
        ids = mb.token["input_ids"].to(self.device)
        shared = self._shared(mb)
        raw, window = self._raw(ids, mb.cu_seqlens, shared, routing=mb.token.get(router_replay.FIELD),
                                record=record, mm=mb.mm)
        routing = self._routing_out.cpu() if record else None
        self._routing_out = None
        rows = shared.tok_row if shared is not None else None
        if self.kind == "causal_lm":
            lp, ent = token_logprobs(raw, ids, mb.cu_seqlens, temperature, with_entropy, rows,
                                     compiled=self.choices.compiled_logprobs, window=window)
            return Outputs(logprobs=lp, entropy=ent, routing=routing)
        return Outputs(values=token_values(raw, mb.cu_seqlens, rows, window), routing=routing)

    def _dummy_loss(self) -> torch.Tensor:
        """An empty micro-batch: a 2-token forward whose loss is exactly zero."""
        raw, _ = self._raw(torch.zeros(2, dtype=torch.long, device=self.device), torch.tensor([0, 2]))
        return raw.float().sum() * 0.0

    # -------------------------------------------------------- no-grad passes
    @torch.no_grad()
    def _per_token(self, batch: Batch, fn: Callable[[Batch], Any]) -> list[tuple[list[int], Any]]:
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

    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                         adapters: bool = True, with_routing: bool = False) -> dict[str, torch.Tensor]:
        """See :class:`TrainingWorker`; ``adapters=False`` (a role with LoRA adapters): the base
        model's log-probs, in :meth:`_adapters_off`. ``with_routing`` (MoE models): also
        ``routing`` ``(T, layers, top_k)`` int16, the experts each token was routed to (those of
        the batch's ``routing`` field where it has one)."""
        if self.kind != "causal_lm":
            raise NotImplementedError(f"{self.backend} backend: role {self.ctx.role} is a {self.kind} model; no log-probs")
        if not adapters:
            with self._adapters_off():
                return self.compute_logprobs(batch, temperature, with_entropy, with_routing=with_routing)
        if with_routing and self.router is None:
            raise ValueError(f"{self.backend} backend: role {self.ctx.role}: routing asked of a model without MoE layers")

        def fn(mb: Batch):
            o = self._outputs(mb, temperature, with_entropy, record=with_routing)
            return {"logprobs": o.logprobs, "entropy": o.entropy, "routing": o.routing}

        res = self._per_token(batch, fn)
        out = {"logprobs": self._scatter_tokens(batch, res, "logprobs")}
        if with_entropy:
            out["entropy"] = self._scatter_tokens(batch, res, "entropy")
        if with_routing:
            out["routing"] = (_scatter_rows(batch, res, "routing") if res else
                              router_replay.unknown(0, self.router.layers, self.router.top_k))
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
            raw, window = self._raw(ids, mb.cu_seqlens, shared, mm=mb.mm)
            return last_token_scores(raw, mb.cu_seqlens, rows, window).cpu()

        out = torch.zeros(len(batch), dtype=torch.float32)
        for group, scores in self._per_token(batch, fn):
            out[torch.tensor(group, dtype=torch.long)] = scores
        return out

    # ------------------------------------------------------------ train step
    def _accumulate(self, batch: Batch, groups: list[list[int]], n_micro: int, loss_fn: LossFn,
                    temperature: float, entropy: bool) -> tuple[float, dict[str, float]]:
        """Micro-batch losses (plus :meth:`_extra_loss`) are scaled by the number of ranks
        before backward (undoing the data-parallel gradient averaging)."""
        loss_sum, metrics = 0.0, {}
        self._begin_accumulate(batch)
        for i in range(n_micro):
            tokens = 0
            with self._micro_scope():
                if i < len(groups):
                    mb = self._on_device(batch.select(groups[i]))
                    tokens = mb.num_tokens
                    loss, m = loss_fn(self._outputs(mb, temperature, with_entropy=entropy), mb)
                    for k, v in m.items():
                        metrics[k] = merge_metric(k, metrics.get(k), float(v))
                else:
                    loss = self._dummy_loss()
            extra = self._extra_loss(tokens)
            if extra is not None:
                loss = loss + extra
            self._backward(loss * self.world_size)
            loss_sum += float(loss.detach())
        return loss_sum, metrics

    # ------------------------------------------------------------------ export
    def save_hf(self, path: str) -> None:
        """A Hugging Face directory (:func:`rlweave.backend_helpers.hf_dir.write_hf`) from
        :meth:`_export_items`; rank 0 writes, all ranks call."""
        self._check_ready("save_hf")
        items = self._export_items()
        if self.rank == 0:
            base = self._base_model()
            dtype = next(iter(base.parameters())).dtype
            cfg = hf_dir.export_config(base.config, self.kind, dtype,
                                       type(base.model).__name__ if self.kind != "causal_lm" else None)
            tok = self.ctx.model.get("tokenizer") or self.ctx.model.get("path")
            hf_dir.write_hf(path, items, cfg, self.kind, tok, self.cfg.hf_shard_bytes)
        else:
            for _ in items:
                pass
        dist.barrier()


def _scatter_rows(batch: Batch, results, key: str) -> torch.Tensor:
    """Per-token tensors ``(n, ...)`` of each micro-batch's samples back in batch order, in their dtype."""
    first = results[0][1][key]
    out = torch.zeros((batch.num_tokens, *first.shape[1:]), dtype=first.dtype)
    cu = batch.cu_seqlens.tolist()
    for group, vals in results:
        v, pos = vals[key].cpu(), 0
        for i in group:
            n = cu[i + 1] - cu[i]
            out[cu[i] : cu[i + 1]] = v[pos : pos + n]
            pos += n
    return out
