"""Preference pairs as a packed :class:`~rlweave.data.batch.Batch` (the layout
:class:`rlweave_algo_dpo.loss.DPOLoss` expects).

Pairs are stored adjacently (chosen, rejected, chosen, rejected, ...) and carry the sample
field ``group`` (= ``pair_id``), the field a backend that keeps groups together in one
micro-batch/rank uses. Mini-batches are always cut between pairs (:func:`pair_minibatches`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlweave.data.batch import Batch


def build_pair_batch(
    prompts: Sequence[Sequence[int]],
    chosen: Sequence[Sequence[int]],
    rejected: Sequence[Sequence[int]],
    pair_ids: Sequence[str],
    meta: Sequence[dict[str, Any]] | None = None,
) -> Batch:
    """Pack ``P`` pairs into ``2P`` samples: prompt + response tokens, ``loss_mask`` on the
    response. Sample fields ``pair_id``, ``group`` (both the pair index), ``is_chosen``,
    ``pair_weight`` (``1/P``); token field ``sft_weight`` (chosen response tokens, summing
    to 1). Sample ids ``f"{pair_id}/chosen"`` and ``f"{pair_id}/rejected"``. Raises
    ``ValueError`` naming the pair when a response is empty or the lists differ in length."""
    n = len(prompts)
    if not (len(chosen) == len(rejected) == len(pair_ids) == n) or (meta is not None and len(meta) != n):
        raise ValueError(f"build_pair_batch: {n} prompts, {len(chosen)} chosen, {len(rejected)} rejected, "
                         f"{len(pair_ids)} ids; they must match")
    if n == 0:
        raise ValueError("build_pair_batch: no pairs")
    seqs, plens, ids, metas = [], [], [], []
    for k, (p, c, r, pid) in enumerate(zip(prompts, chosen, rejected, pair_ids)):
        for side, resp in (("chosen", c), ("rejected", r)):
            if len(resp) == 0:
                raise ValueError(f"preference pair {pid!r}: empty {side} response")
            seqs.append(list(p) + list(resp))
            plens.append(len(p))
            ids.append(f"{pid}/{side}")
            metas.append({**(meta[k] if meta is not None else {}), "pair": str(pid), "side": side})
    batch = Batch.from_sequences(seqs, ids=ids, meta=metas, prompt_lens=plens)
    pair_index = torch.arange(n, dtype=torch.long).repeat_interleave(2)
    is_chosen = torch.tensor([1.0, 0.0] * n)
    batch.add_sample("pair_id", pair_index)
    batch.add_sample("group", pair_index.clone())
    batch.add_sample("is_chosen", is_chosen)
    batch.add_sample("pair_weight", torch.full((2 * n,), 1.0 / n))
    chosen_mask = batch.token["loss_mask"] * is_chosen[batch.sample_index()]
    batch.add_token("sft_weight", chosen_mask / chosen_mask.sum().clamp(min=1.0))
    return batch


def reweight(batch: Batch) -> Batch:
    """Reset ``pair_weight`` and ``sft_weight`` so the pairs of ``batch`` sum to one
    (after :meth:`Batch.select` of a subset of pairs). Returns the same batch."""
    n_pairs = int((batch.sample["is_chosen"] > 0.5).sum())
    batch.sample["pair_weight"] = torch.full((len(batch),), 1.0 / max(n_pairs, 1))
    chosen_mask = batch.token["loss_mask"] * batch.sample["is_chosen"][batch.sample_index()]
    batch.token["sft_weight"] = chosen_mask / chosen_mask.sum().clamp(min=1.0)
    return batch


def pair_minibatches(batch: Batch, num: int) -> list[Batch]:
    """Split a pair batch into ``num`` mini-batches of whole pairs (contiguous, near-equal
    pair counts), each reweighted so its own pairs average to the loss."""
    n_pairs = len(batch) // 2
    if num < 1 or num > n_pairs:
        raise ValueError(f"cannot cut {n_pairs} pairs into {num} mini-batches")
    bounds = [round(i * n_pairs / num) for i in range(num + 1)]
    return [reweight(batch.select(range(2 * bounds[i], 2 * bounds[i + 1]))) for i in range(num)]
