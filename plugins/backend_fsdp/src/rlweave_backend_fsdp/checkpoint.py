"""Sharded checkpoints with torch.distributed.checkpoint (DCP), loaded without pickles.

``path/`` holds the DCP files of ``{"model", "optim"}`` (each rank writes its shards; the
layout is resharding-friendly) and, per rank ``r``, what is not sharded:

* ``extra_rank<r>.json``: ``{"format": 1, "step", "scheduler" (LambdaLR state, JSON values),
  "optimizer_state" (whether ``optim`` was written), "rng": Python and NumPy RNG states}``
  (:mod:`rlweave.data.rng_state`);
* ``extra_rank<r>.safetensors``: the torch CPU generator state (``torch``) and each CUDA
  device's (``cuda.<i>``, when CUDA is initialised), uint8 tensors;

so a run that loads a checkpoint continues exactly as an uninterrupted one.

An optimizer that has not stepped yet (a checkpoint before the first update, such as the one a
run with ``run.max_restarts`` writes at step 0) has no state, and its ``optim`` is not written:
torch's ``get_state_dict`` would create that state with a zero-gradient step, which sets AdamW's
step count to 1 and changes every later update's bias correction, so saving would change the
run. Loading such a checkpoint empties the optimizer's state (a worker that trained since, kept
alive through a recovery, goes back to a never-stepped optimizer). A checkpoint from before
``optimizer_state`` was recorded loads its ``optim`` as before.

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


def save(path: str, model, optimizer, extra: dict, rank: int, frozen: bool = True, device=None) -> None:
    """All ranks: DCP shards of model (and optimizer) plus this rank's extra state. Without
    ``frozen``, parameters that do not train (a LoRA model's base weights) are left out: they
    are the base model's, loaded from its directory. ``device``: where this rank's collectives
    run (CPU when None). An optimizer that has not stepped is not saved (module docstring)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    Path(path).mkdir(parents=True, exist_ok=True)
    opts = _options(frozen)
    with_optim = optimizer_has_state(optimizer, device)
    if with_optim:
        msd, osd = get_state_dict(model, optimizer, options=opts)
        state = {"model": msd, "optim": osd}
    else:  # never stepped (or no optimizer): nothing to save, and get_state_dict would step it
        state = {"model": get_model_state_dict(model, options=opts)}
    dcp.save(state, checkpoint_id=path)
    _save_extra(path, rank, {**extra, "optimizer_state": with_optim}, "fsdp")
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
    if optimizer is not None and extra.get("optimizer_state", True):
        msd, osd = get_state_dict(model, optimizer, options=opts)
        state = {"model": msd, "optim": osd}
        safe_dcp.load(state, root)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=opts)
    else:
        state = {"model": get_model_state_dict(model, options=opts)}
        safe_dcp.load(state, root)
        set_model_state_dict(model, state["model"], options=opts)
        if optimizer is not None:  # saved before its first step: back to a never-stepped optimizer
            optimizer.state.clear()
    rng.set_state(rng_state)
    extra.pop("optimizer_state", None)
    return extra


def optimizer_has_state(optimizer, device=None) -> bool:
    """Whether ``optimizer`` (None: no optimizer) holds state, i.e. has taken a step (AdamW
    creates its moments and step count at the first one), on any rank: collective, since the
    ranks must agree on what they save. ``device``: where this rank's collectives run (CPU
    when None)."""
    import torch

    from rlweave.backend_helpers.finite import any_rank

    has = optimizer is not None and bool(optimizer.state)
    return optimizer is not None and any_rank(has, device if device is not None else torch.device("cpu"))
