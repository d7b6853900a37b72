"""Full parameters out of a DeepSpeed engine, one at a time.

Under ZeRO-3 each parameter is gathered alone (``deepspeed.zero.GatheredParameters``, a
collective every rank joins) and released before rank 0 hands out its copy, so no rank holds
more than one gathered parameter beyond its shards and the parameters DeepSpeed keeps whole
on every rank (those under ``zero_optimization.stage3_param_persistence_threshold``
elements); :class:`StreamStats` records the largest number of other gathered elements seen
while streaming. Under ZeRO-1/2 every rank holds the full
parameters and rank 0 copies them out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class StreamStats:
    """``peak_gathered``: the most parameter elements held gathered (beyond this rank's shards)
    at once during the last stream; ``largest``: the largest parameter's elements."""

    peak_gathered: int = 0
    largest: int = 0


def _gathered_numel(model: torch.nn.Module) -> int:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(p.ds_numel for p in model.parameters()
               if getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE and not getattr(p, "ds_persist", False))


def stream(model: torch.nn.Module, zero3: bool, rank: int, skip: set[str], stats: StreamStats,
           dtype: torch.dtype | None = None, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """All ranks iterate; rank 0 yields ``(HF name, full tensor)`` per parameter (names in
    ``skip`` left out: a tied LM head), cast to ``dtype`` (floating tensors; None: as stored) on
    ``device``, each its own copy."""
    stats.peak_gathered = 0
    stats.largest = 0
    for name, p in model.named_parameters():
        if name in skip:
            continue
        numel = int(getattr(p, "ds_numel", p.numel()))
        stats.largest = max(stats.largest, numel)
        out = None
        if zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([p]):
                stats.peak_gathered = max(stats.peak_gathered, _gathered_numel(model))
                if rank == 0:
                    out = _copy(p.data, dtype, device)
        elif rank == 0:
            out = _copy(p.data, dtype, device)
        if rank == 0:
            yield name, out
        del out


def _copy(t: torch.Tensor, dtype: torch.dtype | None, device: str) -> torch.Tensor:
    to = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return t.detach().to(device=device, dtype=to, copy=True).contiguous()
