"""Shared-prompt packing: samples with the same prompt (GRPO's n samples, DPO's chosen and
rejected) carry the prompt's tokens once in a packed row.

The prompt's tokens are a prefix segment; each sample's response is a continuation segment
that attends to the whole prompt and causally to itself, with positions continuing after
the prompt. Every token then sees exactly the context it has in the unshared sample, so
hidden states, log-probs and gradients are those of the unshared row (up to float
reduction order), while the prompt's projections, MLP and head run once per group instead of
once per sample.

:func:`share` builds the row of one micro-batch; ``tok_row[j]`` is the row position holding
original token ``j``, through which per-token outputs return to the unshared layout.
:func:`plan_units` forms micro-batches of whole groups by their shared token count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from rlweave.backend_helpers.hf_model import micro
from rlweave.backend_helpers.hf_model.attention import AttentionPlan, plan_segments


@dataclass(frozen=True)
class SharedRow:
    """One micro-batch laid out with shared prompts (see module docstring)."""

    input_ids: torch.Tensor  # (T',)
    position_ids: torch.Tensor  # (T',)
    tok_row: torch.Tensor  # (T,) row position of each original token
    plan: AttentionPlan


def prompt_groups(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, prompt_lens: Sequence[int]) -> list[list[int]]:
    """Sample indices grouped by identical prompt tokens, in order of first appearance."""
    cu = cu_seqlens.tolist()
    keys: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompt_lens):
        keys.setdefault(tuple(input_ids[cu[i] : cu[i] + int(p)].tolist()), []).append(i)
    return list(keys.values())


def share(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, prompt_lens: Sequence[int]) -> SharedRow | None:
    """The shared-prompt row of a micro-batch, or None when no two samples share a prompt.

    The row holds the prefix segments (shared prompts, and whole samples whose prompt no
    other sample shares) by increasing length, then the continuation segments (responses) by
    increasing (prompt length, length): the order of :func:`.attention.plan_segments`'
    buckets, so each bucket's queries are one slice of the row."""
    groups = prompt_groups(input_ids, cu_seqlens, prompt_lens)
    if all(len(g) == 1 for g in groups):
        return None
    cu = cu_seqlens.tolist()
    # prefix segments: (length, [(first original token, count) it stands for]); continuations:
    # (prefix index, original start, length)
    pre: list[tuple[int, list[tuple[int, int]]]] = []
    cont: list[tuple[int, int, int]] = []
    for g in groups:
        if len(g) == 1:  # nothing to share: the whole sample is one causal segment
            i = g[0]
            pre.append((cu[i + 1] - cu[i], [(cu[i], cu[i + 1] - cu[i])]))
            continue
        p = int(prompt_lens[g[0]])
        pre.append((p, [(cu[i], p) for i in g]))
        cont.extend((len(pre) - 1, cu[i] + p, cu[i + 1] - cu[i] - p) for i in g if cu[i + 1] - cu[i] > p)
    tok_row = torch.empty(int(cu[-1]), dtype=torch.long)
    ids, pos = [], []
    starts = [0] * len(pre)
    at = 0
    for j in sorted(range(len(pre)), key=lambda j: pre[j][0]):
        n, sources = pre[j]
        starts[j] = at
        ids.append(input_ids[sources[0][0] : sources[0][0] + n])
        pos.append(torch.arange(n))
        for src, _ in sources:
            tok_row[src : src + n] = torch.arange(at, at + n)
        at += n
    conts: list[tuple[int, int, int]] = []
    for j, src, r in sorted(cont, key=lambda c: (pre[c[0]][0], c[2])):
        p = pre[j][0]
        conts.append((j, at, r))
        ids.append(input_ids[src : src + r])
        pos.append(torch.arange(p, p + r))
        tok_row[src : src + r] = torch.arange(at, at + r)
        at += r
    plan = plan_segments([(starts[j], n) for j, (n, _) in enumerate(pre)], conts)
    return SharedRow(torch.cat(ids), torch.cat(pos), tok_row, plan)


def plan_units(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, prompt_lens: Sequence[int],
               budget: int) -> list[list[int]]:
    """Micro-batches (sorted sample-index lists) that keep prompt groups together, by the
    token count of their shared rows (a prompt counts once per micro-batch). A group over
    the budget is cut into parts that each fit (each part carries the prompt again); without
    any shared prompt this is :func:`micro.plan` on the sample lengths."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    groups = prompt_groups(input_ids, cu_seqlens, prompt_lens)
    if all(len(g) == 1 for g in groups):
        return micro.plan(lens, budget)
    units: list[list[int]] = []
    costs: list[int] = []  # shared-row tokens of each unit: the prompt once, then every response
    for g in groups:
        p = int(prompt_lens[g[0]])
        part, cost = [], p
        for i in g:
            r = lens[i] - p
            if part and cost + r > budget:
                units.append(part)
                costs.append(cost)
                part, cost = [], p
            part.append(i)
            cost += r
        units.append(part)
        costs.append(cost)
    bins = micro.plan(costs, budget)
    out = [sorted(i for b in bin_ for i in units[b]) for bin_ in bins]
    out.sort(key=lambda g: g[0])
    return out
