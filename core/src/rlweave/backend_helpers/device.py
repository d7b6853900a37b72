"""The torch device of a training rank, and moving optimizer state between devices."""

from __future__ import annotations

import os
from typing import Any


def rank_device(ctx: Any, backend: str):
    """``torch.device`` for a rank of ``ctx`` (a WorkerContext): on ``cuda``, the visible GPU
    ``LOCAL_RANK`` selects (made current); else the CPU. RuntimeError naming role and rank when
    CUDA is asked for and none is visible."""
    import torch

    if ctx.device != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{backend} backend: role {ctx.role} rank {ctx.rank} asked for cuda but none is visible")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def move_optimizer_state(optimizer: Any, device: Any) -> None:
    """Move every tensor of ``optimizer``'s per-parameter state to ``device`` (None: nothing)."""
    import torch

    if optimizer is None:
        return
    for st in optimizer.state.values():
        for k, v in st.items():
            if torch.is_tensor(v):
                st[k] = v.to(device, non_blocking=True)
