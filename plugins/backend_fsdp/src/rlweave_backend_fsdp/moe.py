"""Mixture-of-experts models in the FSDP backend: their MoE blocks, the grouped-experts
kernel, the router load-balancing loss and the expert-load metrics.

An MoE block is a module with a router child ``gate`` (a ``(num_experts, hidden)`` weight;
its forward returns the router logits, alone or first of a tuple) and an ``experts`` child:
the sparse blocks of transformers' Qwen2-MoE, Qwen3-MoE and Mixtral.

Kernel: when the role selected ``moe_groupgemm``, :func:`apply_kernel` lets the kernel object
replace the experts' forward in place (same parameters and names) before the model is
sharded; otherwise transformers' own experts implementation runs.

Load-balancing loss (Switch Transformer, as transformers' ``load_balancing_loss_func``):
``aux = E * sum_e f_e * P_e`` over the routed tokens of all MoE layers of one forward, with
``f_e`` the fraction of top-k assignments that went to expert ``e`` and ``P_e`` its mean
router probability. :class:`MoETraining` computes it per micro-batch from the router logits
its forward hooks captured, and weights it by the micro-batch's share of the step's tokens
over all data-parallel ranks, so the summed contributions are ``coef`` times the
token-weighted mean of the micro-batches' losses. Like transformers (and Megatron-LM), the
loss is that of each forward's own tokens: ``f`` and ``P`` are not pooled over micro-batches
or ranks, so the value depends on how tokens are grouped into micro-batches.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

log = logging.getLogger("rlweave.backend_fsdp")
KERNEL_NAME = "moe_groupgemm"


@dataclass(frozen=True)
class MoEBlock:
    """One sparse block: its module path, router, experts, expert count and top-k."""

    name: str
    router: nn.Module
    experts: nn.Module
    num_experts: int
    top_k: int


def find_blocks(model: nn.Module) -> list[MoEBlock]:
    """The MoE blocks of ``model`` in module order (empty for a dense model)."""
    cfg = getattr(model, "config", None)
    out = []
    for name, m in model.named_modules():
        router, experts = getattr(m, "gate", None), getattr(m, "experts", None)
        if not isinstance(router, nn.Module) or not isinstance(experts, nn.Module):
            continue
        w = getattr(router, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            continue
        top_k = getattr(router, "top_k", None) or getattr(m, "top_k", None) or getattr(cfg, "num_experts_per_tok", 0)
        if not top_k:
            continue
        out.append(MoEBlock(name, router, experts, int(w.shape[0]), int(top_k)))
    return out


def apply_kernel(model: nn.Module, kernel: Any, device: str, blocks: Sequence[MoEBlock], *,
                 role: str = "policy", rank: int = 0) -> dict[str, Any] | None:
    """Let ``kernel`` (the ``moe_groupgemm`` object, or None when not selected) replace the
    experts' forward of ``model``; call before sharding. Returns its report
    (``{"replaced": n, "impl": name}``), or None when the kernel is not selected or the model
    has no MoE block (logged). Rank 0 logs one line."""
    if kernel is None:
        return None
    if not blocks:
        if rank == 0:
            log.info("role %s: kernel %s selected, but the model has no MoE layers: nothing to replace",
                     role, KERNEL_NAME)
        return None
    report = dict(kernel.apply(model, device))
    if rank == 0:
        log.info("role %s: kernel %s replaced the experts of %s of %d MoE layers (implementation %s)",
                 role, KERNEL_NAME, report.get("replaced"), len(blocks), report.get("impl"))
        for key in ("skipped", "fallback"):
            if report.get(key):
                log.warning("role %s: kernel %s %s: %s", role, KERNEL_NAME, key, report[key])
    return report


def router_topk(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp32 router probabilities, top-k expert indices)`` as the HF routers choose them."""
    probs = torch.softmax(logits.float(), dim=-1)
    return probs, torch.topk(probs, top_k, dim=-1).indices


def load_balancing_loss(logits: Sequence[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """Switch-Transformer auxiliary loss of the router logits of all layers (each
    ``(tokens, num_experts)``): ``num_experts * sum_e f_e * P_e`` (see the module docstring);
    differentiable through ``P``. Equals transformers' ``load_balancing_loss_func`` without
    an attention mask."""
    return _aux_loss([router_topk(x, top_k) for x in logits], num_experts)


def expert_counts(logits: Sequence[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """Tokens routed to each expert, per layer: ``(layers, num_experts)`` float64, on the
    logits' device."""
    return _counts([router_topk(x.detach(), top_k) for x in logits], num_experts)


def _aux_loss(routed: Sequence[tuple[torch.Tensor, torch.Tensor]], num_experts: int) -> torch.Tensor:
    """:func:`load_balancing_loss` of the layers' ``(probabilities, top-k indices)``."""
    counts = _counts(routed, num_experts).sum(0).float()
    probs = sum(p.sum(0) for p, _ in routed)
    rows = sum(int(p.shape[0]) for p, _ in routed)
    if rows == 0:
        return probs.sum() * 0.0
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def _counts(routed: Sequence[tuple[torch.Tensor, torch.Tensor]], num_experts: int) -> torch.Tensor:
    rows = [torch.bincount(idx.reshape(-1), minlength=num_experts) for _, idx in routed]
    return torch.stack(rows).to(torch.float64)


def load_metrics(counts: torch.Tensor) -> dict[str, float]:
    """Expert-load metrics of per-layer token counts ``(layers, num_experts)``:
    ``moe_load_max_over_mean`` / ``moe_load_min_over_mean`` (the busiest / idlest expert's
    tokens over the mean tokens per expert, averaged over layers; 1.0 is perfect balance) and
    ``moe_tokens_per_expert_max`` (the most tokens any expert of any layer received)."""
    mean = counts.mean(1)
    used = mean > 0
    if not bool(used.any()):
        return {}
    return {"moe_load_max_over_mean": float((counts.max(1).values[used] / mean[used]).mean()),
            "moe_load_min_over_mean": float((counts.min(1).values[used] / mean[used]).mean()),
            "moe_tokens_per_expert_max": float(counts.max())}


@dataclass
class RouterTap:
    """Forward hooks on the routers of ``blocks`` that keep the router logits of forwards run
    inside :meth:`capture`, nothing else: an activation-checkpointing recomputation in
    backward runs outside it and is not counted twice."""

    blocks: Sequence[MoEBlock]
    logits: list[torch.Tensor] = field(default_factory=list)
    active: bool = False

    def __post_init__(self) -> None:
        self._handles = [b.router.register_forward_hook(self._hook) for b in self.blocks]

    def _hook(self, module: nn.Module, args: Any, out: Any) -> None:
        if self.active:
            self.logits.append(out[0] if isinstance(out, (tuple, list)) else out)

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[torch.Tensor]]:
        self.logits = []
        self.active = True
        try:
            yield self.logits
        finally:
            self.active = False

    def keep_rows(self, rows: torch.Tensor | None) -> None:
        """Keep only ``rows`` of each captured ``(tokens, experts)`` tensor (the real tokens
        of a right-padded forward); None keeps all."""
        if rows is not None and self.active:
            self.logits[:] = [x.reshape(-1, x.shape[-1]).index_select(0, rows.to(x.device)) for x in self.logits]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class MoETraining:
    """What ``train_step`` adds for an MoE model: the weighted load-balancing loss of each
    micro-batch and the step's expert-load metrics.

    Per step: :meth:`begin_step` (collective: the step's token count over the data-parallel
    ranks), then per micro-batch run the forward inside ``tap.capture()`` and add
    :meth:`micro_loss` to its loss, then :meth:`step_metrics` (collective)."""

    def __init__(self, blocks: Sequence[MoEBlock], coef: float):
        sizes = {(b.num_experts, b.top_k) for b in blocks}
        if len(sizes) != 1:
            raise ValueError(f"fsdp backend: MoE layers with different (experts, top-k): {sorted(sizes)}")
        (self.num_experts, self.top_k), = sizes
        self.blocks = list(blocks)
        self.coef = float(coef)
        self.tap = RouterTap(self.blocks)
        self._tokens = 0
        self._aux: torch.Tensor | float = 0.0
        self._counts: torch.Tensor | None = None

    def begin_step(self, local_tokens: int, device: torch.device) -> None:
        import torch.distributed as dist

        t = torch.tensor([local_tokens], dtype=torch.long, device=device)
        if dist.is_initialized():
            dist.all_reduce(t)
        self._tokens = int(t.item())
        self._aux = 0.0
        self._counts = torch.zeros(len(self.blocks), self.num_experts, dtype=torch.float64, device=device)

    def micro_loss(self, tokens: int) -> torch.Tensor | None:
        """``coef * tokens / step_tokens * aux`` of the forward just captured (``tokens``: its
        sample tokens; 0 for an empty micro-batch, which adds an exact zero). None when
        nothing was captured."""
        logits = self.tap.logits
        if not logits:
            return None
        routed = [router_topk(x, self.top_k) for x in logits]  # once for the loss and the counts
        aux = _aux_loss(routed, self.num_experts)
        weight = tokens / self._tokens if self._tokens and tokens else 0.0
        if weight:  # kept on the device: no host sync per micro-batch
            self._aux = self._aux + weight * aux.detach()
            self._counts += _counts(routed, self.num_experts)
        return aux * (self.coef * weight)

    def step_metrics(self, device: torch.device) -> tuple[dict[str, float], dict[str, float]]:
        """``(to_sum, global_)``: ``moe_aux_loss`` (this rank's part of the step's
        token-weighted mean; the ranks' parts sum to it) and the load metrics of the token
        counts summed over the ranks (equal on every rank)."""
        import torch.distributed as dist

        if self._counts is None:
            raise RuntimeError("MoETraining.step_metrics before begin_step")
        counts = self._counts.clone()
        if dist.is_initialized():
            dist.all_reduce(counts)
        return {"moe_aux_loss": float(self._aux)}, load_metrics(counts.cpu())
