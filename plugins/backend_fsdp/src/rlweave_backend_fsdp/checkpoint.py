"""Sharded checkpoints with torch.distributed.checkpoint (DCP), loaded without pickles.

``path/`` holds the DCP files of ``{"model", "optim"}`` (each rank writes its shards; the
layout is resharding-friendly) and, per rank ``r``, what is not sharded:

* ``extra_rank<r>.json``: ``{"format": 1, "step", "scheduler" (LambdaLR state, JSON values),
  "rng": Python and NumPy RNG states}`` (:mod:`rlweave.data.rng_state`);
* ``extra_rank<r>.safetensors``: the torch CPU generator state (``torch``) and each CUDA
  device's (``cuda.<i>``, when CUDA is initialised), uint8 tensors;

so a run that loads a checkpoint continues exactly as an uninterrupted one.

Loading reads nothing as a pickle: the extra state is JSON and safetensors, DCP's
``.metadata`` and non-tensor items go through :mod:`.safe_dcp` (an allow-listed unpickler,
``weights_only=True``). A file in another form (a pickled ``extra_rank<r>.pt``, a pickle put in
place of a file) raises
:class:`~rlweave.runner.checkpoint.CheckpointError` naming it. Every rank checks its files
before DCP starts and the ranks agree, so either all ranks load or all refuse.
"""

from __future__ import annotations

from pathlib import Path

from rlweave.backend_helpers import safe_dcp
from rlweave.backend_helpers.extra_state import EXTRA_FORMAT, agree as _agree, read_extra  # noqa: F401
from rlweave.backend_helpers.extra_state import save_extra as _save_extra
from rlweave.data import rng_state as rng
from rlweave.data.checkpoint_files import CheckpointError


def _options(frozen: bool):
    """Without ``frozen``: trainable parameters only; loading them leaves the others as they are
    (DCP itself still refuses a checkpoint that lacks a requested key)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=not frozen, strict=frozen)


def save(path: str, model, optimizer, extra: dict, rank: int, frozen: bool = True) -> None:
    """All ranks: DCP shards of model (and optimizer) plus this rank's extra state. Without
    ``frozen``, parameters that do not train (a LoRA model's base weights) are left out: they
    are the base model's, loaded from its directory."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    Path(path).mkdir(parents=True, exist_ok=True)
    opts = _options(frozen)
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer, options=opts)
        state = {"model": msd, "optim": osd}
    else:
        state = {"model": get_model_state_dict(model, options=opts)}
    dcp.save(state, checkpoint_id=path)
    _save_extra(path, rank, extra, "fsdp")
    dist.barrier()


def load(path: str, model, optimizer, rank: int, frozen: bool = True) -> dict:
    """Restore model/optimizer in place; returns the rank's ``extra`` dict (RNG already set).
    All ranks call it; a refused file raises :class:`CheckpointError` on every rank. Without
    ``frozen``, only trainable parameters are read (what :func:`save` wrote without it)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"fsdp backend: checkpoint {path} does not exist (rank {rank})")
    problem = None
    try:  # every file this rank reads, checked before DCP starts its collectives
        extra, rng_state = read_extra(root, rank)
        safe_dcp.read_metadata(root)
    except CheckpointError as exc:
        problem = str(exc)
    _agree(problem)
    opts = _options(frozen)
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer, options=opts)
        state = {"model": msd, "optim": osd}
        safe_dcp.load(state, root)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=opts)
    else:
        state = {"model": get_model_state_dict(model, options=opts)}
        safe_dcp.load(state, root)
        set_model_state_dict(model, state["model"], options=opts)
    rng.set_state(rng_state)
    return extra

