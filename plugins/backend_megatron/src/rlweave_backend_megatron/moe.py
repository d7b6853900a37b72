"""Mixture-of-experts layers with expert parallelism: the MLP of each transformer layer of a
Qwen3-MoE model.

:func:`layer_class` gives megatron's layer spec the module to build for each layer's ``mlp``:
an :class:`ExpertParallelMoE` with

* ``router.weight`` ``(E, H)``: replicated (every rank routes its own tokens), HF
  ``mlp.gate.weight``;
* ``experts.gate_up`` ``(E / ep, 2I, H)`` (gate rows over up rows) and ``experts.down``
  ``(E / ep, H, I)``: the experts of this expert-parallel rank, ``[ep_rank * E / ep,
  (ep_rank + 1) * E / ep)``, HF ``mlp.experts.<e>.{gate,up,down}_proj.weight``.

Routing is Qwen3-MoE's (transformers' ``Qwen3MoeTopKRouter``): softmax in fp32 over the
router logits, the top-k experts, their weights renormalised to sum to 1 when the model's
``norm_topk_prob`` says so. With ``ep > 1`` the (token, expert) pairs travel to the rank holding
the expert and back by two all-to-all exchanges over the expert-parallel group (autograd: the
backward runs the reverse exchanges); each rank runs its experts on every pair it received.
Expert parallelism splits the data-parallel replicas: the ``ep`` replicas of one group exchange
their tokens; the experts' gradients are summed over the replicas holding the same experts
(megatron's expert-data-parallel group, ``dp / ep`` ranks).

Experts are not split over tensor-parallel ranks: each tensor-parallel rank holds its
expert-parallel rank's experts whole and runs them on its (identical) tokens.

Experts run through the ``moe_groupgemm`` kernel when the role selected it (grouped matmuls),
else one matmul pair per expert (:func:`rlweave.backend_helpers.moe.loop_experts`). While a
layer's ``tap`` is a list, each forward appends its router logits ``(tokens, E)`` to it (the
load-balancing loss's value and the expert counts, :func:`capture`); the loss's gradient reaches
the router through the layer's output (:mod:`.aux_grad`, while a layer's ``aux`` is set), with or
without activation recomputation.

Router replay (:mod:`rlweave.backend_helpers.router_replay`): :func:`set_routing` gives every
layer the experts of the next forward's tokens (rows in the layer's flattened ``(s, b)`` order,
``-1`` rows: the router chooses) and whether to record the experts used (:func:`take_routing`).
A replayed layer still computes its router logits (the gate keeps its gradient, the
load-balancing loss sees them) and weighs the given experts by their softmax probabilities
(:func:`~rlweave.backend_helpers.router_replay.replayed`). The routing stays set until the next
:func:`set_routing`, so an activation-checkpointing recomputation in backward replays the same
experts. Replayed indices are global expert ids, which the expert-parallel exchange sends to
the rank holding each expert as it does the router's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlweave.backend_helpers import router_replay
from rlweave.backend_helpers.moe import loop_experts
from rlweave_backend_megatron import aux_grad


@dataclass(frozen=True)
class Experts:
    """What an MoE layer needs from the model config: expert count, top-k, expert width and
    whether the top-k weights are renormalised."""

    num: int
    top_k: int
    ffn: int
    norm_topk: bool


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


class GroupedExperts(nn.Module):
    """This rank's experts, stacked: ``gate_up`` ``(n, 2I, H)``, ``down`` ``(n, H, I)``."""

    def __init__(self, n: int, hidden: int, ffn: int, dtype: torch.dtype):
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(n, 2 * ffn, hidden, dtype=dtype))
        self.down = nn.Parameter(torch.empty(n, hidden, ffn, dtype=dtype))

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, kernel: Any = None) -> torch.Tensor:
        if kernel is not None:
            return kernel.run(x, idx, weights, self.gate_up, self.down, F.silu)
        return loop_experts(x, idx, weights, self.gate_up, self.down, F.silu).to(x.dtype)


class ExpertParallelMoE(nn.Module):
    """A layer's MoE MLP (see the module docstring): ``(s, b, h) -> ((s, b, h), None)``, as
    megatron's MLP returns ``(output, bias)``. Class attributes set by :func:`layer_class`:
    ``spec`` (:class:`Experts`) and ``kernel`` (the ``moe_groupgemm`` object or None)."""

    spec: Experts
    kernel: Any = None

    def __init__(self, config: Any, **_: Any):
        super().__init__()
        from megatron.core import parallel_state as ps

        self.ep = ps.get_expert_model_parallel_world_size()
        self.ep_rank = ps.get_expert_model_parallel_rank()
        self.group = ps.get_expert_model_parallel_group() if self.ep > 1 else None
        n = self.spec.num // self.ep
        self.router = nn.Linear(config.hidden_size, self.spec.num, bias=False, dtype=config.params_dtype)
        self.experts = GroupedExperts(n, config.hidden_size, self.spec.ffn, config.params_dtype)
        self.tap: list[torch.Tensor] | None = None
        self.aux: aux_grad.AuxGrad | None = None  # the load-balancing loss's gradient (aux_grad.set_aux)
        self.replay: torch.Tensor | None = None  # (T, k) experts to use (set_routing), None: the router's
        self.record = False  # keep the experts used in `recorded` (set_routing)
        self.recorded: torch.Tensor | None = None
        self.tally: router_replay.ChangedTally | None = None  # counts what replay changed (set by .replay)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(router logits (T, E), their fp32 softmax (T, E), top-k experts (T, k), their weights
        (T, k) in x's dtype)``; the experts of :attr:`replay` where it has a row without ``-1``
        (module docstring)."""
        logits = self.router(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, idx = torch.topk(probs, self.spec.top_k, dim=-1)
        if self.replay is not None:
            if self.replay.shape != idx.shape:
                raise ValueError(f"megatron backend: router replay: an MoE layer routes {tuple(idx.shape)} "
                                 f"(tokens, top-k); the routing given has {tuple(self.replay.shape)}")
            if self.tally is not None:
                self.tally.add(idx, self.replay)
            idx, weights = router_replay.replayed(logits, idx, self.replay.to(idx.device), self.spec.norm_topk)
        elif self.spec.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.record:
            self.recorded = idx.detach().to(router_replay.DTYPE)
        return logits, probs, idx, weights.to(logits.dtype)

    def forward(self, hidden: torch.Tensor, padding_mask: Any = None, **_: Any):
        s, b, h = hidden.shape
        x = hidden.reshape(-1, h)
        logits, probs, idx, weights = self.route(x)
        if self.tap is not None:
            self.tap.append(logits)
        if self.ep == 1:
            out = self.experts(x, idx, weights, self.kernel)
        else:
            out = self._exchange(x, idx, weights)
        return aux_grad.attach(out.reshape(s, b, h), probs, self.aux), None

    def _exchange(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Pairs to the ranks holding their experts, experts there, results back, weighted sum."""
        import torch.distributed as dist

        k, n = idx.shape[1], self.spec.num // self.ep
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # pairs by expert, hence by destination rank
        counts = torch.bincount(flat, minlength=self.spec.num)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)  # got[r * n + j]: pairs rank r sends my expert j
        send = counts.view(self.ep, n).sum(1).tolist()
        per_source = got.view(self.ep, n)
        recv = per_source.sum(1).tolist()
        rows = _AllToAll.apply(x[order // k], send, recv, self.group)
        local = torch.repeat_interleave(torch.arange(n, device=x.device).repeat(self.ep), got.to(x.device))
        ones = torch.ones(rows.shape[0], 1, dtype=x.dtype, device=x.device)
        y = self.experts(rows, local.unsqueeze(1), ones, self.kernel)
        back = _AllToAll.apply(y, recv, send, self.group)  # in this rank's sorted pair order
        pairs = torch.empty_like(back)
        pairs = pairs.index_copy(0, order, back)
        return (pairs.view(-1, k, x.shape[1]) * weights.unsqueeze(-1)).sum(1)


def layer_class(spec: Experts, kernel: Any = None) -> type[ExpertParallelMoE]:
    """The MoE MLP class of one model (``spec``, ``kernel`` bound), for megatron's layer spec
    (a plain class: megatron builds it with ``config`` alone)."""
    return type("Qwen3MoEMLP", (ExpertParallelMoE,), {"spec": spec, "kernel": kernel})


def layers(model: nn.Module) -> list[ExpertParallelMoE]:
    """The MoE MLPs of a stage's model, in layer order."""
    return [m for m in model.modules() if isinstance(m, ExpertParallelMoE)]


def set_routing(mlps: list[ExpertParallelMoE], rows: torch.Tensor | None, record: bool = False) -> None:
    """Every layer's routing until the next call: ``rows`` ``(T, layers, top_k)`` in the layers'
    flattened token order (None: the routers choose), and whether to record the experts used."""
    if rows is not None and rows.shape[1] != len(mlps):
        raise ValueError(f"megatron backend: router replay: routing of {rows.shape[1]} layers for {len(mlps)} "
                         "MoE layers")
    for i, m in enumerate(mlps):
        m.replay = None if rows is None else rows[:, i].long()
        m.record = bool(record)
        m.recorded = None


def take_routing(mlps: list[ExpertParallelMoE]) -> torch.Tensor:
    """The experts the last forward used, ``(T, layers, top_k)`` int16 in the layers' flattened
    token order (recording on, :func:`set_routing`)."""
    if any(m.recorded is None for m in mlps):
        raise RuntimeError("megatron backend: router replay: the last forward did not record every MoE layer")
    return torch.stack([m.recorded for m in mlps], dim=1)


@contextlib.contextmanager
def capture(mlps: list[ExpertParallelMoE]) -> Iterator[list[torch.Tensor]]:
    """Collect the router logits of the forwards run inside, every layer's in call order (an
    activation-checkpointing recomputation in backward runs outside and is not counted; with
    recomputation the logits have no graph: the loss's gradient goes by :mod:`.aux_grad`)."""
    logits: list[torch.Tensor] = []
    for m in mlps:
        m.tap = logits
    try:
        yield logits
    finally:
        for m in mlps:
            m.tap = None


