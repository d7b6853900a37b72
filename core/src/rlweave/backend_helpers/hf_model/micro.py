"""Micro-batches by token budget, and the tensors one forward pass needs.

:func:`plan` groups sample indices so that each group's token total stays within the
budget (first-fit decreasing; a sample longer than the budget gets a group of its own).
:func:`packed_inputs` lays one group out as a single row with per-sample positions and
``cu_seq_lens`` (padding-free); :func:`padded_inputs` as right-padded rows with a mask.
"""

from __future__ import annotations

from typing import Sequence

import torch


def plan(seqlens: Sequence[int], budget: int) -> list[list[int]]:
    """Sample-index groups (each sorted) with ``sum(len) <= budget`` where possible."""
    order = sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = seqlens[i]
        for b, load in enumerate(loads):
            if load + n <= budget:
                bins[b].append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    groups = [sorted(b) for b in bins]
    groups.sort(key=lambda g: g[0])
    return groups


def positions(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Position ids of a packed row: ``0..len-1`` within each sample."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.arange(int(cu_seqlens[-1])) - torch.repeat_interleave(cu_seqlens[:-1], lens)


def varlen_kwargs(cu_seqlens: torch.Tensor, device) -> dict:
    """The ``cu_seq_lens_q/k`` and ``max_length_q/k`` keywords describing a packed row."""
    cu32 = cu_seqlens.to(torch.int32).to(device)
    mx = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return {"cu_seq_lens_q": cu32, "cu_seq_lens_k": cu32, "max_length_q": mx, "max_length_k": mx}


def packed_inputs(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, device) -> dict:
    """Keyword arguments for a packed forward of one micro-batch (one row)."""
    return {
        "input_ids": input_ids.view(1, -1).to(device),
        "position_ids": positions(cu_seqlens).view(1, -1).to(device),
        **varlen_kwargs(cu_seqlens, device),
    }


def padded_inputs(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, device, pad_id: int = 0):
    """Right-padded ``(B, L)`` inputs and the flat index of each real token in the padded grid."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    b, width = len(lens), max(lens)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    flat = []
    for r, (s, n) in enumerate(zip(cu_seqlens[:-1].tolist(), lens)):
        ids[r, :n] = input_ids[s : s + n]
        mask[r, :n] = 1
        flat.append(torch.arange(n) + r * width)
    kwargs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    return kwargs, torch.cat(flat).to(device)
