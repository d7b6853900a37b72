"""Optimizer state sharded over data-parallel replicas (``options.shard_optimizer``, ZeRO stage 1).

Each trainable parameter has one *owner* among the data-parallel ranks that hold it (the ranks
of the same tensor-parallel and pipeline position in each replica). Only the owner keeps AdamW's
state for it and steps it; the step is then:

1. every rank's gradient is summed onto the owner (``reduce`` over the data-parallel group, one
   call per bucket of tensors with the same owner, :mod:`.buckets`);
2. the gradient norm sums each parameter once, on its owner (over every rank of the role);
3. owners clip and step their parameters;
4. each parameter (its fp32 master, with master weights) is broadcast from its owner to the
   other replicas, in buckets likewise.

The result equals the unsharded optimizer's (the same sums, the same AdamW on each parameter);
each rank holds about ``1/dp`` of the AdamW state. Owners are given by :func:`owners`: largest
parameters first, each to the least-loaded rank, from names and sizes alone, so every rank
computes the same plan. A tied embedding and its copy on the last pipeline stage are both owned
by data-parallel rank 0, so the two copies' gradients and state meet on the same rank.
"""

from __future__ import annotations


def owners(sizes: dict[str, int], dp: int, pinned: dict[str, int] | None = None) -> dict[str, int]:
    """Data-parallel rank owning each name of ``sizes`` (name -> element count): the ``pinned``
    ones on their given rank, then the others, largest first, each on the rank owning the fewest
    elements so far (ties: the lower rank)."""
    pinned = {n: r for n, r in (pinned or {}).items() if n in sizes}
    load = [0] * dp
    out: dict[str, int] = {}
    for name, r in pinned.items():
        out[name] = r
        load[r] += sizes[name]
    for name in sorted((n for n in sizes if n not in pinned), key=lambda n: (-sizes[n], n)):
        r = min(range(dp), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += sizes[name]
    return out
