"""Splitting a step's batch into mini-batches (the optimizer steps of one pass)."""

from __future__ import annotations


def split(order: list[int], parts: int) -> list[list[int]]:
    """``order`` (sample indices, possibly shuffled) cut into ``parts`` contiguous pieces whose
    sizes differ by at most one; empty pieces (fewer samples than parts) are left out."""
    n = len(order)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [order[bounds[i]:bounds[i + 1]] for i in range(parts) if bounds[i + 1] > bounds[i]]
