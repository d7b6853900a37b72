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
    return _with_pair_fields(Batch.from_sequences(seqs, ids=ids, meta=metas, prompt_lens=plens))


def select_pair_batch(samples: Batch, pairs: Sequence[tuple[int, int]], pair_ids: Sequence[str]) -> Batch:
    """The layout of :func:`build_pair_batch` from sampled trajectories: ``pairs`` are (chosen,
    rejected) sample indices of ``samples`` (a rollout batch, :mod:`rlweave.interfaces.rollout`),
    whose ``loss_mask`` is kept as it is (a multi-turn episode trains its model tokens only)."""
    if len(pairs) != len(pair_ids) or not pairs:
        raise ValueError(f"select_pair_batch: {len(pairs)} pairs, {len(pair_ids)} ids (at least one pair)")
    picked = samples.select([i for pair in pairs for i in pair])
    sides = [(pid, side) for pid in pair_ids for side in ("chosen", "rejected")]
    ids = [f"{pid}/{side}" for pid, side in sides]
    metas = [{**m, "pair": str(pid), "side": side} for m, (pid, side) in zip(picked.meta, sides)]
    out = Batch(cu_seqlens=picked.cu_seqlens,
                token={k: picked.token[k] for k in ("input_ids", "loss_mask")},
                sample={"prompt_len": picked.sample["prompt_len"]}, ids=ids, meta=metas, mm=picked.mm)
    return _with_pair_fields(out)


def record_candidates(samples: Batch, n_records: int) -> tuple[list[list[int]], list[list[bool]]]:
    """Per record (the rollout batch's sample field ``group``), its sample indices and whether each
    may be one side of a pair: a non-empty final answer (an agent's failed episode has none), and
    the prompt ids most of the record's samples start from, so chosen and rejected continue the
    same prompt. A record usually has ``n_samples`` samples with one prompt; an agent's episode may
    add samples of its own (resets, forks: ``docs/agents.md``), which are not paired. Raises
    ``RuntimeError`` for a record with no sample."""
    members: list[list[int]] = [[] for _ in range(n_records)]
    for j, g in enumerate(samples.sample["group"].tolist()):
        members[int(g)].append(j)
    empty = [i for i, m in enumerate(members) if not m]
    if empty:
        raise RuntimeError(f"the rollout returned no sample for records {empty} of {n_records}")
    cu, plen = samples.cu_seqlens.tolist(), samples.sample["prompt_len"].tolist()
    prompt = [tuple(samples.token["input_ids"][cu[j]:cu[j] + plen[j]].tolist()) for j in range(len(samples))]
    usable = []
    for m in members:
        counts: dict[tuple[int, ...], int] = {}  # in order of first appearance: ties go to the first
        for j in m:
            counts[prompt[j]] = counts.get(prompt[j], 0) + 1
        common = max(counts, key=counts.__getitem__)
        usable.append([len(samples.meta[j]["response_ids"]) > 0 and prompt[j] == common for j in m])
    return members, usable


def _with_pair_fields(batch: Batch) -> Batch:
    """Add the pair fields to ``batch`` of (chosen, rejected) samples side by side."""
    n = len(batch) // 2
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
