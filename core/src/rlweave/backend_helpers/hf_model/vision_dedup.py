"""The distinct images of a micro-batch, so that the vision tower encodes each one once.

In GRPO every prompt is sampled several times, so a micro-batch often holds the same image more
than once. :func:`distinct` finds the copies among the images of the samples' vision inputs
(:attr:`rlweave.data.batch.Batch.mm`): two images are the same when they have the same grid
(``image_grid_thw`` row), the same pixel rows' shape and dtype, and bitwise-equal pixel rows.
Candidates are grouped by grid and a cheap fingerprint of their bits (the sum of the bits read as
integers, computed where the pixels are, one host sync for all of them; copies that share storage
need none), and every merge is confirmed by an exact comparison of the bits, so a collision of
fingerprints costs a comparison and never merges different images.

:class:`Distinct` holds the distinct images' inputs for the tower and, for every image token of
the micro-batch's images in order, the row of the distinct images' features it takes
(:attr:`Distinct.index`): the features of the copies are ``features.index_select(0, index)``, so
a backward through them sums each copy's gradient into its image's features, which is what
encoding each copy gives up to the order of float summation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

#: the integer dtype of each element size, to read any tensor's bits as integers
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Distinct:
    """The distinct images of a micro-batch (module docstring). ``pixels``: their pixel rows, in
    the order of their first copy; ``grid``: their ``(U, 3)`` grids; ``index``: ``(N,)`` long,
    for each image token of all images in sample order, its row of the distinct images'
    concatenated features; ``sizes``: the number of image tokens of each image, in sample order
    (``sum(sizes) == N``)."""

    pixels: torch.Tensor
    grid: torch.Tensor
    index: torch.Tensor
    sizes: list[int]


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s elements as integers of its element size (its bits), flat."""
    return x.contiguous().view(-1).view(_INT[x.element_size()])


def distinct(mm: Sequence[dict], merge: int) -> Distinct | None:
    """The distinct images of the vision inputs ``mm`` (one dict per sample with images:
    ``pixel_values`` rows of all its images, ``image_grid_thw`` one row per image); ``merge``:
    the vision config's ``spatial_merge_size`` (an image of grid ``(t, h, w)`` has
    ``t * h * w`` pixel rows and ``t * h * w / merge**2`` tokens). None when every image is
    distinct: the caller then encodes the inputs as they are. ValueError for a sample whose
    pixel rows are not as many as its grids say."""
    grids = torch.cat([m["image_grid_thw"] for m in mm]).cpu()  # one host sync for all grids
    patches = grids.prod(-1).tolist()
    images: list[torch.Tensor] = []
    for m in mm:
        counts = patches[len(images):len(images) + int(m["image_grid_thw"].shape[0])]
        if int(m["pixel_values"].shape[0]) != sum(counts):
            raise ValueError(f"vision inputs: {m['pixel_values'].shape[0]} pixel rows for image grids of "
                             f"{sum(counts)} patches")
        images.extend(torch.split(m["pixel_values"], counts))
    keys = [(tuple(g), tuple(x.shape), x.dtype) for g, x in zip(grids.tolist(), images)]
    counts_of: dict[tuple, int] = {}
    for k in keys:
        counts_of[k] = counts_of.get(k, 0) + 1
    if all(c == 1 for c in counts_of.values()):
        return None
    which = _match(images, keys, [counts_of[k] > 1 for k in keys])
    firsts = sorted(set(which))
    if len(firsts) == len(images):
        return None
    tokens = [p // merge ** 2 for p in patches]
    start, offset = {}, 0
    for u in firsts:
        start[u] = offset
        offset += tokens[u]
    index = torch.cat([torch.arange(start[u], start[u] + tokens[i]) for i, u in enumerate(which)])
    return Distinct(pixels=torch.cat([images[u] for u in firsts]), grid=grids[firsts], index=index, sizes=tokens)


def _storage(x: torch.Tensor) -> tuple:
    """What makes two tensors the same view of the same memory."""
    return x.device, x.data_ptr(), tuple(x.shape), x.stride(), x.dtype


def _match(images: list[torch.Tensor], keys: list[tuple], candidate: list[bool]) -> list[int]:
    """For each image, the position of its first copy among ``images`` (itself when it is the
    first); only the ``candidate`` images (whose key another image shares) are compared: a view
    of the same memory as an earlier one of the same key is its copy, the others are
    fingerprinted and compared bit by bit."""
    which = list(range(len(images)))
    seen: dict[tuple, int] = {}
    picked = []
    for i, c in enumerate(candidate):
        if c:
            j = seen.setdefault((keys[i], _storage(images[i])), i)
            if j != i:
                which[i] = j
            else:
                picked.append(i)
    if len(picked) < 2:
        return which
    prints = torch.stack([_bits(images[i]).sum(dtype=torch.int64) for i in picked]).tolist()
    firsts: dict[tuple, list[int]] = {}
    for i, fp in zip(picked, prints):
        bucket = firsts.setdefault((keys[i], fp), [])
        same = next((j for j in bucket if torch.equal(_bits(images[j]), _bits(images[i]))), None)
        if same is None:
            bucket.append(i)
        else:
            which[i] = same
    for i, j in enumerate(which):  # a storage copy of an image that is itself a copy
        which[i] = which[j]
    return which
