"""MoE router replay for the megatron worker: a micro-batch's ``routing`` token field (token order,
:mod:`rlweave.backend_helpers.router_replay`) laid out on the MoE layers' flattened tokens, and
the experts a recording forward used brought back to token order.

A micro-batch reaches the MoE layers as ``(s, b, h)`` hidden states (sequence first) flattened to
``(s * b, h)``; :func:`.pipeline.layer_rows` gives where each of its tokens sits there (a packed
row: in order; right-padded rows: ``position * rows + row``). Padding positions get ``-1``: the
router chooses, and nothing reads them. Mixture-of-experts models run one pipeline stage without
sequence parallelism (:mod:`.checks`), so every tensor-parallel rank routes the same tokens and one
micro-batch's forward and backward run before the next forward: the routing set for a forward is
still set when an activation-checkpointing recomputation replays it in backward.

Contract: :meth:`Replay.check` once per batch before any collective (a bad field raises the same
ValueError on every rank), :meth:`Replay.set` before each forward (every micro-batch, the empty
ones too, so nothing of an earlier one is left set), :meth:`Replay.take` after a recording
forward, :meth:`Replay.clear` when the pass or step is over. :attr:`Replay.tally` counts the
replayed decisions that differ from the routers' own (``tally.reset`` before a training step,
``tally.metrics`` after it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlweave.backend_helpers import router_replay
from rlweave_backend_megatron import moe, pipeline

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch


class Replay:
    """Router replay over ``mlps`` (a model's MoE layers, in layer order) of ``spec``
    (:class:`.moe.Experts`); errors name ``where`` (the backend and role)."""

    def __init__(self, mlps: list[moe.ExpertParallelMoE], spec: moe.Experts, where: str, pp: int = 1,
                 sequence_parallel: bool = False):
        self.mlps, self.spec, self.where, self.pp, self.sp = mlps, spec, where, pp, sequence_parallel
        self.tally = router_replay.ChangedTally()  # what replay changed in a training step
        for m in mlps:
            m.tally = self.tally

    @property
    def layers(self) -> int:
        return len(self.mlps)

    def check(self, batch: Batch, record: bool = False) -> None:
        """ValueError unless ``batch``'s routing field (if any) is ``(tokens, layers, top_k)`` of
        this model's expert ids (or ``-1``), and unless this layout can replay (one stage, no
        sequence parallelism); ``record``: the pass records (``with_routing``)."""
        routing = batch.token.get(router_replay.FIELD)
        if routing is None and not record:
            return
        if self.pp > 1 or self.sp:
            raise ValueError(f"{self.where}: router replay needs one pipeline stage (parallel.pp=1) and no "
                             f"options.sequence_parallel; got pp={self.pp}, sequence_parallel={self.sp}")
        if routing is not None:
            router_replay.check(routing, self.layers, self.spec.top_k, self.where, self.spec.num)

    def set(self, mb: Batch | None, rows: pipeline.Rows, record: bool = False) -> None:
        """The next forward of ``mb`` (laid out as ``rows``; None: an empty micro-batch, whose
        routers choose) replays its routing field, if any, and records with ``record``."""
        routing = mb.token.get(router_replay.FIELD) if mb is not None else None
        given = None
        if routing is not None:
            b, width = rows.ids.shape
            given = router_replay.to_rows(routing.to(rows.ids.device), b * width, pipeline.layer_rows(rows))
        moe.set_routing(self.mlps, given, record and mb is not None)

    def take(self, rows: pipeline.Rows) -> torch.Tensor:
        """The experts the last (recording) forward used, ``(tokens, layers, top_k)`` int16 in the
        micro-batch's token order, on CPU."""
        return router_replay.from_rows(moe.take_routing(self.mlps), pipeline.layer_rows(rows)).cpu()

    def clear(self) -> None:
        """Nothing set: the routers choose, nothing records."""
        moe.set_routing(self.mlps, None, False)

    def unknown(self, tokens: int) -> torch.Tensor:
        """``-1`` routing of ``tokens`` tokens (the output's shape before it is filled)."""
        return router_replay.unknown(tokens, self.layers, self.spec.top_k)
