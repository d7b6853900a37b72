"""Router load-balancing loss, expert-load metrics and the per-expert loop of mixture-of-experts
models, shared by the training backends so every backend trains the same objective.

Load-balancing loss (Switch Transformer, as transformers' ``load_balancing_loss_func``):
``aux = E * sum_e f_e * P_e`` over the routed tokens of all MoE layers of one forward, with
``f_e`` the fraction of top-k assignments that went to expert ``e`` and ``P_e`` its mean
router probability. :class:`AuxLoss` computes it per micro-batch from the router logits of
that forward (real tokens only), and weights it by the micro-batch's share of the step's tokens
over all data-parallel replicas, so the summed contributions are ``coef`` times the
token-weighted mean of the micro-batches' losses. Like transformers (and Megatron-LM), the
loss is that of each forward's own tokens: ``f`` and ``P`` are not pooled over micro-batches
or replicas, so the value depends on how tokens are grouped into micro-batches.

The counts ``f`` carry no gradient, so the loss's gradient with respect to the router
probabilities ``p`` of any layer's row is the same vector, ``E * C / R^2`` (``C``: the top-k
counts pooled over the layers, ``R``: the rows pooled over the layers; :func:`aux_probs_grad`).
A backend whose router logits lose their graph (activation recomputation) attaches that vector
to each layer's own probabilities instead of differentiating the loss
(:meth:`AuxLoss.micro_value_and_grad`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def loop_experts(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, gate_up: torch.Tensor,
                 down: torch.Tensor, act_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The experts output ``(T, H)`` of tokens ``x`` ``(T, H)`` routed to ``top_k_index`` ``(T, k)``
    with ``top_k_weights``, one plain loop over the stacked experts ``gate_up`` ``(E, 2I, H)`` (gate
    rows over up rows) and ``down`` ``(E, H, I)``: for each expert, ``gate, up = (x @ gate_up[e].T)
    .chunk(2)``, ``y = (act(gate) * up) @ down[e].T``, added to its tokens times their weights. In
    the promoted dtype of ``x`` and the weights; the caller picks the compute dtype. Syncs with the
    host once per expert. The weights are split per expert with ``unbind`` (not ``gate_up[e]``,
    whose backward would build a full-size gradient per expert)."""
    import torch.nn.functional as F

    out = torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, top_k_weights.dtype), device=x.device)
    gate_ups, downs = gate_up.unbind(0), down.unbind(0)
    for e in range(len(gate_ups)):
        token, choice = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        gate, up = F.linear(x[token], gate_ups[e]).chunk(2, dim=-1)
        y = F.linear(act_fn(gate) * up, downs[e])
        out = out.index_add(0, token, y * top_k_weights[token, choice, None])
    return out


def router_topk(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp32 router probabilities, top-k expert indices)`` as the HF routers choose them."""
    probs = torch.softmax(logits.float(), dim=-1)
    return probs, torch.topk(probs, top_k, dim=-1).indices


def load_balancing_loss(logits: Sequence[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """Switch-Transformer auxiliary loss of the router logits of all layers (each
    ``(tokens, num_experts)``): ``num_experts * sum_e f_e * P_e`` (see the module docstring);
    differentiable through ``P``. Equals transformers' ``load_balancing_loss_func`` without
    an attention mask."""
    return aux_loss([router_topk(x, top_k) for x in logits], num_experts)


def expert_counts(logits: Sequence[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """Tokens routed to each expert, per layer: ``(layers, num_experts)`` float64, on the
    logits' device."""
    return counts_of([router_topk(x.detach(), top_k) for x in logits], num_experts)


def aux_loss(routed: Sequence[tuple[torch.Tensor, torch.Tensor]], num_experts: int) -> torch.Tensor:
    """:func:`load_balancing_loss` of the layers' ``(probabilities, top-k indices)``."""
    counts = counts_of(routed, num_experts).sum(0).float()
    probs = sum(p.sum(0) for p, _ in routed)
    rows = sum(int(p.shape[0]) for p, _ in routed)
    if rows == 0:
        return probs.sum() * 0.0
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def aux_probs_grad(routed: Sequence[tuple[torch.Tensor, torch.Tensor]], num_experts: int) -> torch.Tensor:
    """The gradient of :func:`aux_loss` of ``routed`` with respect to each layer's probabilities
    summed over its rows: ``num_experts * C / R^2`` ``(num_experts,)`` fp32 (``C``: the top-k counts
    pooled over the layers, ``R``: their rows; the same for every row of every layer). Zeros when
    there are no rows."""
    counts = counts_of(routed, num_experts).sum(0).float()
    rows = sum(int(p.shape[0]) for p, _ in routed)
    if rows == 0:
        return torch.zeros_like(counts)
    return counts * (num_experts / float(rows) ** 2)


def counts_of(routed: Sequence[tuple[torch.Tensor, torch.Tensor]], num_experts: int) -> torch.Tensor:
    """Per-layer token counts ``(layers, num_experts)`` float64 of the layers' top-k indices."""
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


class AuxLoss:
    """The weighted load-balancing loss of each micro-batch of a step, and the step's
    expert-load metrics, for ``layers`` MoE layers of ``num_experts`` experts and top-``top_k``.

    Per step: :meth:`begin_step` (collective over ``group``, the data-parallel replicas: the
    step's token count), then per micro-batch :meth:`micro_loss` of the router logits its
    forward produced (add it to the micro-batch's loss) or :meth:`micro_value_and_grad` (add
    the value, attach the gradient to the routers' probabilities), then :meth:`step_metrics`
    (collective over ``group``)."""

    def __init__(self, layers: int, num_experts: int, top_k: int, coef: float):
        self.layers, self.num_experts, self.top_k, self.coef = int(layers), int(num_experts), int(top_k), float(coef)
        self._tokens = 0
        self._aux: torch.Tensor | float = 0.0
        self._counts: torch.Tensor | None = None

    def begin_step(self, local_tokens: int, device: torch.device, group: Any = None) -> None:
        import torch.distributed as dist

        t = torch.tensor([local_tokens], dtype=torch.long, device=device)
        if dist.is_initialized():
            dist.all_reduce(t, group=group)
        self._tokens = int(t.item())
        self._aux = 0.0
        self._counts = torch.zeros(self.layers, self.num_experts, dtype=torch.float64, device=device)

    def micro_loss(self, logits: Sequence[torch.Tensor], tokens: int) -> torch.Tensor | None:
        """``coef * tokens / step_tokens * aux`` of one forward's router logits (each layer's
        ``(tokens, num_experts)``; ``tokens``: the micro-batch's sample tokens, 0 for an empty
        micro-batch, which adds an exact zero). None when ``logits`` is empty."""
        if not logits:
            return None
        routed = [router_topk(x, self.top_k) for x in logits]  # once for the loss and the counts
        aux, weight = self._record(routed, tokens)
        return aux * (self.coef * weight)

    def micro_value_and_grad(self, logits: Sequence[torch.Tensor],
                             tokens: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``(value, probs_grad)`` of one forward's router logits, used instead of
        :meth:`micro_loss` (each adds the forward's share to the step's metrics: call one of them
        once per forward): ``value``, :meth:`micro_loss`'s value without a graph, and
        ``probs_grad`` ``(num_experts,)`` fp32, its gradient with respect to any layer's router
        probabilities (fp32 softmax of its logits) summed over the rows given
        (:func:`aux_probs_grad` times ``coef * tokens / step_tokens``; None where that factor is
        0: an empty micro-batch or ``coef`` 0). None when ``logits`` is empty."""
        if not logits:
            return None
        routed = [router_topk(x.detach(), self.top_k) for x in logits]
        aux, weight = self._record(routed, tokens)
        scale = self.coef * weight
        return aux * scale, (aux_probs_grad(routed, self.num_experts) * scale if scale else None)

    def _record(self, routed: Sequence[tuple[torch.Tensor, torch.Tensor]], tokens: int) -> tuple[torch.Tensor, float]:
        """``(aux_loss, tokens / step_tokens)`` of one forward; adds its share to the step's
        metrics (nothing for an empty micro-batch)."""
        aux = aux_loss(routed, self.num_experts)
        weight = tokens / self._tokens if self._tokens and tokens else 0.0
        if weight:  # kept on the device: no host sync per micro-batch
            self._aux = self._aux + weight * aux.detach()
            self._counts += counts_of(routed, self.num_experts)
        return aux, weight

    def step_metrics(self, group: Any = None) -> tuple[dict[str, float], dict[str, float]]:
        """``(to_sum, global_)``: ``moe_aux_loss`` (this replica's part of the step's
        token-weighted mean; the replicas' parts sum to it) and the load metrics of the token
        counts summed over ``group`` (equal on every rank)."""
        import torch.distributed as dist

        if self._counts is None:
            raise RuntimeError("AuxLoss.step_metrics before begin_step")
        counts = self._counts.clone()
        if dist.is_initialized():
            dist.all_reduce(counts, group=group)
        return {"moe_aux_loss": float(self._aux)}, load_metrics(counts.cpu())
