"""The batches backend scenarios run on, and how ranks split and gather them.

Same arguments -> the same token ids on every rank and in the test process, so a test can
compare per-sample outputs of any world size with a single-process reference. Every batch
carries ``token_weight`` = the token-mean weight over the whole batch (the convention
:func:`~rlweave.testing.scenarios.losses.nll_loss` uses).
"""

from __future__ import annotations

from typing import Any


def fixed_batch(vocab: int = 128, seed: int = 0):
    """Six samples of skewed lengths with prompts; ``token_weight`` = token-mean over the batch."""
    import torch

    from rlweave.data.batch import Batch

    g = torch.Generator().manual_seed(seed)
    lens = [5, 17, 9, 30, 3, 12]
    seqs = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lens]
    prompt = [2, 5, 3, 10, 1, 4]
    b = Batch.from_sequences(seqs, prompt_lens=prompt)
    b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
    return b


def group_batch(vocab: int = 128, seed: int = 1):
    """Nine samples, three per prompt (GRPO-style groups, prompt-major), responses of mixed
    lengths including an empty one; ``token_weight`` = token-mean over the batch."""
    import torch

    from rlweave.data.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in (4, 7, 2)]
    rlens = [[6, 6, 3], [9, 0, 5], [11, 11, 11]]
    seqs = [p + torch.randint(2, vocab, (r,), generator=g).tolist() for p, rs in zip(prompts, rlens) for r in rs]
    b = Batch.from_sequences(seqs, prompt_lens=[len(p) for p, rs in zip(prompts, rlens) for _ in rs])
    b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
    return b


def shard_indices(world: int, rank: int, n: int) -> list[int]:
    """The samples of an ``n``-sample batch rank ``rank`` of ``world`` gets. Deliberately
    uneven: rank 0 gets one sample, the others share the rest, so ranks run different
    micro-batch counts and the padding with empty micro-batches is exercised."""
    if world == 1:
        return list(range(n))
    if rank == 0:
        return [0]
    rest = list(range(1, n))
    return rest[rank - 1 :: world - 1]


def gather_by_sample(local: dict[int, Any]) -> dict[int, Any]:
    """Every rank's ``{sample index: tensor}`` merged (on CPU), on every rank; collective."""
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, {k: v.cpu() for k, v in local.items()})
    merged: dict[int, Any] = {}
    for d in out:
        merged.update(d)
    return merged
