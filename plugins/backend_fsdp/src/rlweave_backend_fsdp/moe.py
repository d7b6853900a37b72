"""Mixture-of-experts models in the FSDP backend: their MoE blocks, the grouped-experts
kernel, the router load-balancing loss and the expert-load metrics.

The MoE blocks are the HF model layer's (:mod:`rlweave.backend_helpers.hf_model.moe_blocks`).

Kernel: when the role selected ``moe_groupgemm``, :func:`apply_kernel` lets the kernel object
replace the experts' forward in place (same parameters and names) before the model is
sharded; otherwise transformers' own experts implementation runs.

Load-balancing loss and expert-load metrics: :mod:`rlweave.backend_helpers.moe` (shared with the
megatron backend); :class:`MoETraining` feeds it the router logits its forward hooks captured.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlweave.backend_helpers.hf_model.moe_blocks import MoEBlock, find_blocks
from rlweave.backend_helpers.moe import AuxLoss, expert_counts, load_balancing_loss, load_metrics, router_topk

__all__ = ["KERNEL_NAME", "MoEBlock", "MoETraining", "RouterTap", "apply_kernel", "expert_counts", "find_blocks",
           "load_balancing_loss", "load_metrics", "router_topk"]

log = logging.getLogger("rlweave.backend_fsdp")
KERNEL_NAME = "moe_groupgemm"


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
    micro-batch and the step's expert-load metrics (:class:`~rlweave.backend_helpers.moe.AuxLoss`).

    Per step: :meth:`begin_step` (collective: the step's token count over the data-parallel
    ranks), then per micro-batch run the forward inside ``tap.capture()`` and add
    :meth:`micro_loss` to its loss, then :meth:`step_metrics` (collective)."""

    def __init__(self, blocks: Sequence[MoEBlock], coef: float):
        sizes = {(b.num_experts, b.top_k) for b in blocks}
        if len(sizes) != 1:
            raise ValueError(f"fsdp backend: MoE layers with different (experts, top-k): {sorted(sizes)}")
        (num_experts, top_k), = sizes
        self.blocks = list(blocks)
        self.tap = RouterTap(self.blocks)
        self.aux = AuxLoss(len(self.blocks), num_experts, top_k, coef)

    def begin_step(self, local_tokens: int, device: torch.device) -> None:
        self.aux.begin_step(local_tokens, device)

    def micro_loss(self, tokens: int) -> torch.Tensor | None:
        """``coef * tokens / step_tokens * aux`` of the forward just captured (``tokens``: its
        sample tokens; 0 for an empty micro-batch, which adds an exact zero). None when
        nothing was captured."""
        return self.aux.micro_loss(self.tap.logits, tokens)

    def step_metrics(self, device: torch.device) -> tuple[dict[str, float], dict[str, float]]:
        """``(to_sum, global_)``: ``moe_aux_loss`` (this rank's part of the step's
        token-weighted mean; the ranks' parts sum to it) and the load metrics of the token
        counts summed over the ranks (equal on every rank)."""
        return self.aux.step_metrics()
