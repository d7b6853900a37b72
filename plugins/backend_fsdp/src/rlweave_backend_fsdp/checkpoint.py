"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

``path/`` holds the DCP files of ``{"model", "optim"}`` (each rank writes its shards; the
layout is resharding-friendly) and ``extra_rank<r>.pt`` with what is per rank: LR-schedule
state, optimizer step count and RNG states (torch CPU/CUDA, Python, NumPy), so a run that
loads a checkpoint continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch


def rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])


def save(path: str, model, optimizer, extra: dict, rank: int) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    Path(path).mkdir(parents=True, exist_ok=True)
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=path)
    torch.save({**extra, "rng": rng_state()}, Path(path) / f"extra_rank{rank}.pt")
    dist.barrier()


def load(path: str, model, optimizer, rank: int) -> dict:
    """Restore model/optimizer in place; returns the rank's ``extra`` dict (RNG already set)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict,
    )

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"fsdp backend: checkpoint {path} does not exist (rank {rank})")
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
    f = root / f"extra_rank{rank}.pt"
    if not f.exists():  # resumed on more ranks than saved: share rank 0's schedule state
        f = root / "extra_rank0.pt"
    extra = torch.load(f, weights_only=False)
    set_rng_state(extra.pop("rng"))
    return extra
