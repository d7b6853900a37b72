"""Moving one micro-batch through pipeline stages, and tensors between ranks of a model replica.

:class:`Stages` runs a micro-batch forward on this rank's stage (receiving the previous
stage's activations, sending its own to the next) and backward in reverse (receiving the
gradient of its output, sending the gradient of its input). Every stage sees the same
micro-batch (the scheduler gives a whole replica the same shard), so shapes are known on
every rank and only tensors travel. One micro-batch is in flight at a time: correct and
simple, not overlapped (megatron's interleaved 1F1B schedules would overlap stages).

:func:`padded` lays a micro-batch out as right-padded rows with megatron's boolean attention
mask (True = masked: causal and key padding), which the CPU path needs explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch


@dataclass
class Rows:
    """A micro-batch as ``(B, L)`` rows: ids, positions, mask ``(B, 1, L, L)`` and the flat
    index (into ``B * L``) of each real token in packed order."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    flat: torch.Tensor


def padded(mb: "Batch | None", device) -> Rows:
    """Right-padded rows of ``mb`` (None: one 2-token row of zeros whose loss is multiplied by 0)."""
    if mb is None:
        lens, ids_flat, starts = [2], torch.zeros(2, dtype=torch.long), [0]
    else:
        cu = mb.cu_seqlens.tolist()
        lens, ids_flat, starts = [b - a for a, b in zip(cu[:-1], cu[1:])], mb.token["input_ids"].cpu(), cu[:-1]
    b, width = len(lens), max(lens)
    ids = torch.zeros((b, width), dtype=torch.long)
    valid = torch.zeros((b, width), dtype=torch.bool)
    flat = []
    for r, (s, n) in enumerate(zip(starts, lens)):
        ids[r, :n] = ids_flat[s:s + n]
        valid[r, :n] = True
        flat.append(torch.arange(n) + r * width)
    causal = torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1)
    mask = causal.unsqueeze(0) | ~valid.unsqueeze(1)  # (B, L, L): future keys or padding keys
    positions = torch.arange(width).unsqueeze(0).expand(b, width)
    return Rows(ids.to(device), positions.to(device), mask.unsqueeze(1).to(device), torch.cat(flat).to(device))


class Stages:
    """This rank's pipeline stage of one model replica (see module docstring)."""

    def __init__(self, model: torch.nn.Module, pp_rank: int, pp: int, device: torch.device):
        from megatron.core import parallel_state as ps

        self.model, self.pp_rank, self.pp, self.device = model, pp_rank, pp, device
        self.first, self.last = pp_rank == 0, pp_rank == pp - 1
        self.tied = getattr(model, "share_embeddings_and_output_weights", False)
        if pp > 1:
            self.prev = ps.get_pipeline_model_parallel_prev_rank()
            self.next = ps.get_pipeline_model_parallel_next_rank()
            self.last_rank = ps.get_pipeline_model_parallel_last_rank()
            self.group = ps.get_pipeline_model_parallel_group()
        self._input: torch.Tensor | None = None
        self.hidden = model.config.hidden_size
        self.dtype = model.config.params_dtype

    def forward(self, rows: Rows) -> torch.Tensor:
        """The stage's output: logits ``(B, L, V/tp)`` or head values ``(B, L, 1)`` on the last
        stage, hidden states ``(L, B, H)`` elsewhere (already sent on to the next stage)."""
        if self.pp == 1:
            return self.model(rows.ids, rows.positions, attention_mask=rows.mask)
        if not self.first:
            b, width = rows.ids.shape
            h = torch.empty((width, b, self.hidden), dtype=self.dtype, device=self.device)
            dist.recv(h, src=self.prev)
            if torch.is_grad_enabled():
                h.requires_grad_(True)
            self._input = h
            self.model.set_input_tensor(h)
        out = self.model(rows.ids, rows.positions, attention_mask=rows.mask)
        if not self.last:
            dist.send(out.detach().contiguous(), dst=self.next)
        return out

    def backward(self, out: torch.Tensor, loss: torch.Tensor | None) -> None:
        """Backward of the last :meth:`forward`: from ``loss`` on the last stage, from the next
        stage's gradient elsewhere; sends the input's gradient to the previous stage."""
        if self.last:
            loss.backward()
        else:
            g = torch.empty_like(out)
            dist.recv(g, src=self.next)
            torch.autograd.backward(out, g)
        if not self.first:
            grad = self._input.grad if self._input.grad is not None else torch.zeros_like(self._input)
            dist.send(grad.contiguous(), dst=self.prev)
        self._input = None

    def broadcast_from_last(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``out`` as the last stage holds it, on every stage of the replica."""
        if self.pp == 1:
            return out
        res = {}
        for k, v in out.items():
            t = v.to(self.device)
            dist.broadcast(t, src=self.last_rank, group=self.group)
            res[k] = t.cpu()
        return res

    def is_tied_copy(self, name: str) -> bool:
        """Whether ``name`` is the last stage's copy of the tied embedding (counted on stage 0)."""
        return self.pp > 1 and self.last and self.tied and name == "output_layer.weight"

    def share_embedding_grads(self) -> None:
        """Sum the tied embedding's gradient with its copy on the last stage (pipelines only)."""
        if self.pp == 1 or not self.tied:
            return
        from megatron.core import parallel_state as ps

        if not (self.first or self.last):
            return
        w = self.model.shared_embedding_or_output_weight()
        dist.all_reduce(w.grad, group=ps.get_embedding_group())

    def copy_tied_from_first(self, optimizer=None, states: tuple[str, ...] = ()) -> None:
        """Set the last stage's copy of the tied embedding (and its ``states`` in ``optimizer``)
        to the first stage's (pipelines only; after loading a checkpoint)."""
        if self.pp == 1 or not self.tied or not (self.first or self.last):
            return
        from megatron.core import parallel_state as ps

        w = self.model.shared_embedding_or_output_weight()
        tensors = [w.data]
        if optimizer is not None:
            st = optimizer.state.setdefault(w, {})
            tensors += [st.setdefault(k, torch.zeros_like(w)) for k in states]
        for t in tensors:
            if self.last:
                t.zero_()
            dist.all_reduce(t, group=ps.get_embedding_group())

    def to_first(self, full: torch.Tensor | None, stage: int, tp_rank: int) -> torch.Tensor | None:
        """A full tensor held by ``stage``'s first tensor-parallel rank, moved to stage 0's
        (the replica's first rank); None on every other rank."""
        if stage == 0 or tp_rank != 0:
            return full if (stage == self.pp_rank and tp_rank == 0) else None
        from megatron.core import parallel_state as ps

        ranks = ps.get_pipeline_model_parallel_group()
        src = dist.get_global_rank(ranks, stage)
        dst = dist.get_global_rank(ranks, 0)
        if self.pp_rank == stage:
            dims = torch.tensor([full.dim(), *full.shape, *([0] * (4 - full.dim()))], dtype=torch.long)
            dist.send(dims.to(self.device), dst=dst)
            dist.send(full.contiguous(), dst=dst)
            return None
        if self.pp_rank == 0:
            dims = torch.zeros(5, dtype=torch.long, device=self.device)
            dist.recv(dims, src=src)
            shape = dims[1:1 + int(dims[0])].tolist()
            t = torch.empty(shape, dtype=self.dtype, device=self.device)
            dist.recv(t, src=src)
            return t
        return None


def gather_tp(shard: torch.Tensor, tp: int, tp_rank: int, group) -> list[torch.Tensor] | None:
    """All tensor-parallel shards of a parameter on the group's first rank (rank order), None elsewhere."""
    if tp == 1:
        return [shard]
    dst = dist.get_global_rank(group, 0)
    bufs = [torch.empty_like(shard) for _ in range(tp)] if tp_rank == 0 else None
    dist.gather(shard.contiguous(), bufs, dst=dst, group=group)
    return bufs
