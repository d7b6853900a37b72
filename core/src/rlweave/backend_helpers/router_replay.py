"""MoE router replay: record the experts each token was routed to, and run a forward with given
experts instead of the router's own top-k.

Routing is a per-token tensor ``(tokens, layers, top_k)`` of expert indices (int16; ``-1`` in a
row: no routing known for that token in that layer, the router chooses itself), the layers in
module order (:func:`rlweave.backend_helpers.hf_model.moe_blocks.find_blocks`). It travels as the
``routing`` token field of a :class:`~rlweave.data.batch.Batch`, so packing, micro-batching and
data-parallel sharding carry it with its tokens.

:class:`RouterReplay` puts one forward hook on each block's router (transformers' top-k routers
return ``(logits, weights, indices)``). For each forward, :meth:`RouterReplay.set` gives the
routing of that forward's rows (or None: route as usual) and whether to record. With routing
given, the hook keeps the router's logits (computed as usual, so the gate gets its gradient) and
replaces the experts by the given ones and their weights by the softmax probabilities of those
experts (renormalised over the top-k where the router normalises: ``norm_topk_prob``, Mixtral),
in the router's own dtype. The routing stays set until the next :meth:`~RouterReplay.set`, so an
activation-checkpointing recomputation in backward replays the same experts.

The row layouts of a forward (a packed row, right-padded rows, a shared-prompt row) map to and
from token order with :func:`to_rows` and :func:`from_rows`. :func:`check` and :func:`replayed`
(given experts -> their weights) are shared with backends that route in their own MoE layers
(the megatron backend's ``ExpertParallelMoE``).

:class:`ChangedTally` counts, over a training step's replayed forwards, the routing decisions
(token x MoE layer) where the router's own top-k differs from the experts replayed:
``moe_replay_changed_frac``, what replay changed (R3: where trainer and engine disagree).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

#: the batch's token field holding routing
FIELD = "routing"
#: the dtype routing is stored in (batches, dumps)
DTYPE = torch.int16
#: the training-step metric of :class:`ChangedTally`
CHANGED = "moe_replay_changed_frac"


class ChangedTally:
    """Of a training step's replayed routing decisions (a token in one MoE layer with a given
    routing), the share whose experts differ, as a set, from the router's own top-k.

    Per step: :meth:`reset` (before the step's forwards), :meth:`add` per layer forward (nothing
    is counted before the first reset), :meth:`metrics` after the step (collective over
    ``group``: every rank calls it). An activation-checkpointing recomputation counts a forward
    twice, both parts of the share alike. Counts stay on the device: no host sync per forward."""

    def __init__(self) -> None:
        self._sums: torch.Tensor | None = None  # [changed, replayed], float64

    def reset(self, device: torch.device) -> None:
        self._sums = torch.zeros(2, dtype=torch.float64, device=device)

    def add(self, idx: torch.Tensor, given: torch.Tensor) -> None:
        """Count one layer's forward: ``idx`` ``(rows, k)`` the router's own top-k, ``given`` the
        routing replayed (rows with a ``-1`` are not replayed and not counted)."""
        if self._sums is None:
            return
        given = given.to(idx.device, idx.dtype)
        used = ~(given < 0).any(-1)
        differs = (idx.sort(-1).values != given.sort(-1).values).any(-1) & used
        self._sums += torch.stack([differs.sum(), used.sum()]).to(self._sums)

    def metrics(self, group: Any = None) -> dict[str, float]:
        """``{CHANGED: share}`` over the ranks of ``group`` since :meth:`reset`; empty when no
        decision was replayed (or before the first reset, where no rank reset)."""
        import torch.distributed as dist

        if self._sums is None:
            return {}
        sums = self._sums.clone()
        if dist.is_initialized():
            dist.all_reduce(sums, group=group)
        changed, replayed = (float(x) for x in sums.cpu())
        return {CHANGED: changed / replayed} if replayed else {}


class RouterReplay:
    """Record and replay hooks on the routers of ``blocks`` (each with ``.router``, ``.top_k``;
    see the module docstring). Not thread-safe: one forward at a time."""

    def __init__(self, blocks: Sequence[Any]):
        self.blocks = list(blocks)
        self.top_k = max((int(b.top_k) for b in self.blocks), default=0)
        self._rows: torch.Tensor | None = None
        self._record = False
        self.recorded: list[torch.Tensor | None] = []
        self.tally = ChangedTally()
        self._handles = [b.router.register_forward_hook(self._hook(i)) for i, b in enumerate(self.blocks)]

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def check(self, routing: torch.Tensor, where: str) -> None:
        """ValueError naming ``where`` unless ``routing`` is ``(tokens, layers, top_k)`` of this model."""
        check(routing, self.layers, self.top_k, where)

    def set(self, rows: torch.Tensor | None, record: bool = False) -> None:
        """The next forward's routing, one row per row position of its input (None: the routers
        choose); with ``record``, that forward's routing is kept in :attr:`recorded` (one
        ``(rows, top_k)`` tensor per layer)."""
        self._rows = None if rows is None else rows.long()
        self._record = bool(record)
        self.recorded = [None] * self.layers

    def take(self) -> torch.Tensor:
        """The routing recorded by the last forward, ``(rows, layers, top_k)`` int16 (on the device)."""
        if any(r is None for r in self.recorded):
            raise RuntimeError("RouterReplay.take: the last forward did not record every MoE layer")
        out = torch.stack(self.recorded, dim=1)
        self._record = False
        return out

    def _hook(self, layer: int):
        def hook(module: nn.Module, args: Any, out: Any) -> Any:
            if self._rows is None and not self._record:
                return None
            if not isinstance(out, tuple) or len(out) != 3:
                raise TypeError(f"router replay: router {type(module).__name__} returns "
                                f"{type(out).__name__}; expected (logits, weights, indices)")
            logits, weights, idx = out
            if self._rows is not None:
                given = self._rows[:, layer].to(idx.device)
                if given.shape != idx.shape:
                    raise ValueError(f"router replay: MoE layer {layer} routes {tuple(idx.shape)} "
                                     f"(rows, top-k); the routing given has {tuple(given.shape)}")
                norm = getattr(module, "norm_topk_prob", type(module).__name__.startswith("Mixtral"))
                self.tally.add(idx, given)
                idx, probs = replayed(logits, idx, given, norm)
                out = (logits, probs.to(weights.dtype), idx)
            if self._record:
                self.recorded[layer] = idx.detach().to(DTYPE)
            return out

        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def check(routing: torch.Tensor, layers: int, top_k: int, where: str, experts: int | None = None) -> None:
    """ValueError naming ``where`` unless ``routing`` is ``(tokens, layers, top_k)`` (and, given
    ``experts``, its indices are ``-1`` or expert ids below ``experts``)."""
    if routing.dim() != 3 or routing.shape[1] != layers or routing.shape[2] != top_k:
        raise ValueError(f"{where}: token field {FIELD!r} has shape {tuple(routing.shape)}; this model's routing "
                         f"is (tokens, {layers} MoE layers, top-{top_k})")
    if experts is not None and routing.numel() and (int(routing.min()) < -1 or int(routing.max()) >= experts):
        raise ValueError(f"{where}: token field {FIELD!r} holds expert indices from {int(routing.min())} to "
                         f"{int(routing.max())}; this model's are 0..{experts - 1} (-1: the router chooses)")


def replayed(logits: torch.Tensor, idx: torch.Tensor, given: torch.Tensor,
             normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts and weights of one layer's replayed forward: ``logits`` ``(rows, E)`` the
    router's, ``idx`` ``(rows, k)`` its own top-k, ``given`` ``(rows, k)`` the routing to replay.
    A row of ``given`` with no ``-1`` replaces the router's experts; the weights are the fp32
    softmax probabilities of the experts used (differentiable in ``logits``, so the router keeps
    its gradient), renormalised to sum to 1 over the top-k when ``normalise``."""
    idx = torch.where((given < 0).any(-1, keepdim=True), idx, given.to(idx.dtype))
    probs = torch.softmax(logits.float(), dim=-1).gather(-1, idx)
    if normalise:
        probs = probs / probs.sum(-1, keepdim=True)
    return idx, probs


def to_rows(routing: torch.Tensor, n_rows: int, index: torch.Tensor | None) -> torch.Tensor:
    """Token-order ``routing`` ``(T, L, k)`` laid out on a forward's ``n_rows`` row positions:
    token ``j`` goes to row position ``index[j]`` (None: the identity, a packed row); other
    positions (padding) get ``-1`` (the router chooses)."""
    if index is None:
        return routing
    out = torch.full((n_rows, *routing.shape[1:]), -1, dtype=routing.dtype, device=routing.device)
    out[index.to(routing.device)] = routing
    return out


def from_rows(rows: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """The inverse of :func:`to_rows`: each token's routing from its row position."""
    return rows if index is None else rows[index.to(rows.device)]


def unknown(tokens: int, layers: int, top_k: int) -> torch.Tensor:
    """Routing of ``tokens`` tokens for which none is known (all ``-1``)."""
    return torch.full((tokens, layers, top_k), -1, dtype=DTYPE)
