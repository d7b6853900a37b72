"""Pipeline stages of one model replica: this rank's stage, the point-to-point traffic between
neighbouring stages, and tensors between ranks of a replica.

:class:`Stages` runs a micro-batch forward on this rank's stage (:meth:`Stages.run`) and backward
(:meth:`Stages.backward`), and exchanges activations and their gradients with the neighbouring
stages (``recv_forward``, ``send_forward``, ``send_forward_recv_backward``...). Every exchange posts
all its sends and receives at once and waits for them together (``batch_isend_irecv``), so two
neighbours that send to each other in the same step never deadlock (gloo on CPU, NCCL on CUDA).
Every stage sees the same micro-batches (the scheduler gives a whole replica the same shard), so
shapes are known on every rank and only tensors travel. In which order a stage runs its
micro-batches is the schedule's business (:mod:`.schedules`). The time a stage spends waiting in
these exchanges accumulates in :attr:`Stages.wait_s` (the pipeline's bubble, seen from this stage).

:func:`packed_row` lays a micro-batch out as one row of its samples back to back (THD, with
megatron's ``PackedSeqParams``); :func:`padded` as right-padded rows with megatron's boolean
attention mask (True = masked: causal and key padding), which the CPU path needs explicitly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch


@dataclass
class Rows:
    """A micro-batch as ``(B, L)`` rows: ids, positions, mask ``(B, 1, L, L)`` (None when
    packed) and the flat index (into ``B * L``) of each real token in packed order; ``packed``:
    megatron's ``PackedSeqParams`` of a packed micro-batch (one row), else None."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    flat: torch.Tensor
    packed: object = None


def layer_rows(r: Rows) -> torch.Tensor:
    """Where the real tokens of ``r`` sit, in packed order, among a transformer layer's flattened
    activations (megatron's sequence-first ``(L, B)`` order)."""
    b, width = r.ids.shape
    return (r.flat % width) * b + r.flat // width


def packed_row(mb: Batch | None, device, multiple: int = 1) -> Rows:
    """``mb`` as one row of its samples back to back (THD), positions restarting at each sample
    (None: one 2-token sample of zeros whose loss is multiplied by 0); a row whose length is not a
    multiple of ``multiple`` (sequence parallelism: the tensor-parallel size) ends with one more
    sample of zeros, whose outputs are never read."""
    from rlweave_backend_megatron import packed

    if mb is None:
        ids, cu = torch.zeros(2, dtype=torch.long), torch.tensor([0, 2])
    else:
        ids, cu = mb.token["input_ids"].cpu(), mb.cu_seqlens.cpu()
    real = int(cu[-1])
    pad = -real % multiple
    if pad:
        ids, cu = torch.cat([ids, ids.new_zeros(pad)]), torch.cat([cu, cu.new_tensor([real + pad])])
    starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])
    positions = torch.arange(real + pad) - starts
    return Rows(ids.view(1, -1).to(device), positions.view(1, -1).to(device), None,
                torch.arange(real, device=device), packed.params(cu, device))


def padded(mb: Batch | None, device, multiple: int = 1) -> Rows:
    """Right-padded rows of ``mb`` (None: one 2-token row of zeros whose loss is multiplied by 0),
    their width a multiple of ``multiple`` (sequence parallelism: the tensor-parallel size)."""
    if mb is None:
        lens, ids_flat, starts = [2], torch.zeros(2, dtype=torch.long), [0]
    else:
        cu = mb.cu_seqlens.tolist()
        lens, ids_flat, starts = [b - a for a, b in zip(cu[:-1], cu[1:])], mb.token["input_ids"].cpu(), cu[:-1]
    b, width = len(lens), -(-max(lens) // multiple) * multiple
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

    def __init__(self, model: torch.nn.Module, pp_rank: int, pp: int, device: torch.device, seq_split: int = 1):
        from megatron.core import parallel_state as ps

        self.model, self.pp_rank, self.pp, self.device = model, pp_rank, pp, device
        self.seq_split = seq_split  # sequence parallelism: a stage's output holds 1/tp of the sequence
        self.first, self.last = pp_rank == 0, pp_rank == pp - 1
        self.tied = getattr(model, "share_embeddings_and_output_weights", False)
        if pp > 1:
            self.prev = ps.get_pipeline_model_parallel_prev_rank()
            self.next = ps.get_pipeline_model_parallel_next_rank()
            self.last_rank = ps.get_pipeline_model_parallel_last_rank()
            self.group = ps.get_pipeline_model_parallel_group()
        self.wait_s = 0.0
        self.hidden = model.config.hidden_size
        self.dtype = model.config.params_dtype

    # ------------------------------------------------------------- compute
    def run(self, rows: Rows, h: torch.Tensor | None) -> torch.Tensor:
        """The stage's output for ``rows``: logits ``(B, L, V/tp)`` or head values ``(B, L, 1)``
        on the last stage, hidden states ``(L, B, H)`` elsewhere; ``h`` is the previous stage's
        output (None on the first stage), made to require grad when grad is enabled."""
        if h is not None:
            if torch.is_grad_enabled():
                h.requires_grad_(True)
            self.model.set_input_tensor(h)
        return self.model(rows.ids, rows.positions, attention_mask=rows.mask, packed_seq_params=rows.packed)

    def forward(self, rows: Rows) -> torch.Tensor:
        """:meth:`run` with the input received from the previous stage and the output sent on."""
        out = self.run(rows, self.recv_forward(rows))
        self.send_forward(out)
        return out

    def backward(self, h: torch.Tensor | None, out: torch.Tensor, loss: torch.Tensor | None,
                 grad: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of one micro-batch's forward (input ``h``, output ``out``): from ``loss`` on
        the last stage, from the next stage's ``grad`` elsewhere; returns the gradient of ``h``
        (None on the first stage)."""
        if self.last:
            loss.backward()
        else:
            torch.autograd.backward(out, grad)
        if h is None:
            return None
        return h.grad if h.grad is not None else torch.zeros_like(h)

    # ------------------------------------------------------------ exchanges
    def _hidden(self, rows: Rows) -> torch.Tensor:
        b, width = rows.ids.shape
        return torch.empty((width // self.seq_split, b, self.hidden), dtype=self.dtype, device=self.device)

    def _exchange(self, sends: list, recvs: list) -> None:
        """Post every ``(tensor, peer)`` send and receive at once, then wait for all of them."""
        ops = [dist.P2POp(dist.isend, t.detach().contiguous(), peer) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
        if not ops:
            return
        t0 = time.perf_counter()
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        self.wait_s += time.perf_counter() - t0

    def recv_forward(self, rows: Rows) -> torch.Tensor | None:
        """The previous stage's output for ``rows`` (None on the first stage)."""
        if self.first:
            return None
        h = self._hidden(rows)
        self._exchange([], [(h, self.prev)])
        return h

    def send_forward(self, out: torch.Tensor) -> None:
        """``out`` to the next stage (nothing on the last)."""
        if not self.last:
            self._exchange([(out, self.next)], [])

    def recv_backward(self, out: torch.Tensor) -> torch.Tensor | None:
        """The gradient of ``out`` from the next stage (None on the last stage)."""
        if self.last:
            return None
        g = torch.empty_like(out)
        self._exchange([], [(g, self.next)])
        return g

    def send_backward(self, grad: torch.Tensor | None) -> None:
        """The gradient of this stage's input to the previous stage (nothing on the first)."""
        if not self.first:
            self._exchange([(grad, self.prev)], [])

    def send_forward_recv_backward(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
        """``out`` to the next stage and, in the same exchange, the gradient of an earlier output
        ``like`` from it (None on the last stage)."""
        if self.last:
            return None
        g = torch.empty_like(like)
        self._exchange([(out, self.next)], [(g, self.next)])
        return g

    def send_backward_recv_forward(self, grad: torch.Tensor | None, rows: Rows) -> torch.Tensor | None:
        """The gradient of this stage's input to the previous stage and, in the same exchange,
        that stage's output for the next micro-batch ``rows`` (None on the first stage)."""
        if self.first:
            return None
        h = self._hidden(rows)
        self._exchange([(grad, self.prev)], [(h, self.prev)])
        return h

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

    def share_embedding_grads(self, main=lambda p: p) -> None:
        """Sum the tied embedding's gradient with its copy on the last stage (pipelines only);
        ``main(p)`` is the tensor holding a parameter's gradient (its master, if any)."""
        if self.pp == 1 or not self.tied:
            return
        from megatron.core import parallel_state as ps

        if not (self.first or self.last):
            return
        w = main(self.model.shared_embedding_or_output_weight())
        dist.all_reduce(w.grad, group=ps.get_embedding_group())

    def copy_tied_from_first(self, optimizer=None, states: tuple[str, ...] = (), main=lambda p: p) -> None:
        """Set the last stage's copy of the tied embedding (and its ``states`` in ``optimizer``)
        to the first stage's (pipelines only; after loading a checkpoint); ``main(p)`` is the
        tensor the optimizer holds for a parameter (its master, if any)."""
        if self.pp == 1 or not self.tied or not (self.first or self.last):
            return
        from megatron.core import parallel_state as ps

        w = main(self.model.shared_embedding_or_output_weight())
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
