"""Data-parallel scatter and gather of batches (framework-agnostic; imports torch lazily).

Rank layout: a role of ``world_size`` ranks and data-parallel size ``dp`` is cut into
``dp`` contiguous blocks of ``world_size // dp`` ranks (dp outermost); all ranks of a block
(its tensor/pipeline-parallel peers) get the same shard, and the block's first rank gives
the block's result. ``dp`` is ``parallel['dp']`` when given, else ``world_size`` divided by
the product of the other parallel sizes (``ep`` excluded: it splits the replicas).

Gathering puts results back in the original sample order, by type:

* a :class:`~rlweave.data.batch.Batch` -> one Batch in the original order;
* a tensor with one row per token of the shard -> a ``(T, ...)`` tensor in batch order;
  one row per sample -> ``(n, ...)`` in batch order (when every sample is one token long
  the two orders coincide);
* a list/tuple with one entry per sample -> a list in batch order;
* a dict -> the same dict with each value gathered;
* anything else -> the list of per-shard values, in data-parallel rank order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rlweave.config.placement import WITHIN_DP

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch


def dp_size(world_size: int, parallel: Mapping[str, int]) -> int:
    """Number of data-parallel shards of a role (see module docstring)."""
    if parallel.get("dp"):
        dp = int(parallel["dp"])
    else:
        other = 1
        for k, v in parallel.items():
            if k != "dp" and k not in WITHIN_DP:
                other *= int(v)
        dp = max(1, world_size // other)
    if dp < 1 or world_size % dp:
        raise ValueError(f"data-parallel size {dp} does not divide world size {world_size}")
    return dp


def block_leaders(world_size: int, dp: int) -> list[int]:
    """First rank of each data-parallel block."""
    return list(range(0, world_size, world_size // dp))


def is_batch(x: Any) -> bool:
    from rlweave.data.batch import Batch

    return isinstance(x, Batch)


def scatter(batch: "Batch", parts: int) -> tuple[list[list[int]], list["Batch"]]:
    """Token-balanced shards (``Batch.balanced_partition``): sample indices per shard, and
    the shards themselves (samples keep their relative order inside a shard)."""
    partitions = batch.balanced_partition(parts)
    return partitions, [batch.select(p) for p in partitions]


def partition_lengths(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """``Batch.balanced_partition`` for plain lengths (e.g. prompt lengths)."""
    import torch

    from rlweave.data.batch import Batch

    cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(torch.as_tensor(list(lengths), dtype=torch.long), 0)
    return Batch(cu_seqlens=cu).balanced_partition(parts)


def reorder_lists(per_shard: Sequence[Sequence[Any]], partitions: Sequence[Sequence[int]], n: int) -> list[Any]:
    """Per-shard lists (one entry per index of the shard) back into one list of ``n``."""
    out: list[Any] = [None] * n
    for part, values in zip(partitions, per_shard):
        if len(values) != len(part):
            raise ValueError(f"shard returned {len(values)} entries for {len(part)} samples")
        for i, v in zip(part, values):
            out[i] = v
    return out


def gather(results: Sequence[Any], batch: "Batch", partitions: Sequence[Sequence[int]], shards: Sequence["Batch"]) -> Any:
    """One result per shard (data-parallel rank order) -> one result in batch order."""
    import torch

    from rlweave.data.batch import Batch

    first = results[0]
    if all(r is None for r in results):
        return None
    # one shard holding every sample in order (one data-parallel block): nothing to reorder
    whole = len(partitions) == 1 and list(partitions[0]) == list(range(len(batch)))
    if isinstance(first, Batch):
        if whole:
            return first
        merged = Batch.concat(results)
        order = torch.as_tensor([i for p in partitions for i in p], dtype=torch.long)
        return merged.select(torch.argsort(order))
    if isinstance(first, dict):
        keys = list(first)
        if any(not isinstance(r, dict) or list(r) != keys for r in results):
            raise ValueError("data-parallel ranks returned dicts with different keys")
        return {k: gather([r[k] for r in results], batch, partitions, shards) for k in keys}
    if isinstance(first, torch.Tensor) and all(isinstance(r, torch.Tensor) and r.dim() >= 1 for r in results):
        if whole and first.shape[0] in (batch.num_tokens, len(batch)):
            return first
        if all(r.shape[0] == s.num_tokens for r, s in zip(results, shards)):
            cu = batch.cu_seqlens.tolist()
            src = [torch.arange(cu[i], cu[i + 1]) for p in partitions for i in p]
            index = torch.cat(src) if src else torch.zeros(0, dtype=torch.long)
            size = batch.num_tokens
        elif all(r.shape[0] == len(s) for r, s in zip(results, shards)):
            index = torch.as_tensor([i for p in partitions for i in p], dtype=torch.long)
            size = len(batch)
        else:
            shapes = [tuple(r.shape) for r in results]
            raise ValueError(f"cannot gather tensors of shapes {shapes}: rows are neither tokens "
                             f"{[s.num_tokens for s in shards]} nor samples {[len(s) for s in shards]} of the shards")
        cat = torch.cat(list(results))
        out = torch.empty((size,) + tuple(cat.shape[1:]), dtype=cat.dtype, device=cat.device)
        out[index] = cat
        return out
    if isinstance(first, (list, tuple)) and all(
        isinstance(r, (list, tuple)) and len(r) == len(s) for r, s in zip(results, shards)
    ):
        return reorder_lists(results, partitions, len(batch))
    return list(results)
