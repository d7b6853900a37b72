"""Sharded checkpoints with torch.distributed.checkpoint (DCP), loaded without pickles.

``path/`` holds the DCP files of ``{"model", "optim"}`` (each rank writes its shards; the
layout is resharding-friendly) and, per rank ``r``, what is not sharded:

* ``extra_rank<r>.json``: ``{"format": 1, "step", "scheduler" (LambdaLR state, JSON values),
  "rng": Python and NumPy RNG states}`` (:mod:`rlweave.runner.rng`);
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
from typing import Any

from rlweave.runner import rng
from rlweave.runner.checkpoint import CheckpointError, read_state_json, refuse_pickle, write_json

from rlweave_backend_fsdp import safe_dcp

EXTRA_FORMAT = 1


def _names(rank: int) -> tuple[str, str, str]:
    return f"extra_rank{rank}.json", f"extra_rank{rank}.safetensors", f"extra_rank{rank}.pt"


def save_extra(path: str | Path, rank: int, extra: dict[str, Any]) -> None:
    """Write ``extra`` (JSON values: ``step``, ``scheduler`` ...) and this process's RNG
    states as ``extra_rank<rank>.json`` + ``.safetensors`` into ``path``."""
    from safetensors.torch import save_file

    rng_json, tensors = rng.split(rng.get_state())
    js, st, _ = _names(rank)
    try:
        write_json(Path(path) / js, {**extra, "format": EXTRA_FORMAT, "rng": rng_json})
    except TypeError as exc:
        raise TypeError(f"fsdp backend: checkpoint extra state must be JSON values: {exc}") from None
    save_file(tensors, str(Path(path) / st))


def read_extra(path: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(extra, rng_state)`` of rank ``rank`` from ``path`` (rank 0's when a resumed run has
    more ranks than the saved one), validated; :class:`CheckpointError` naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    js, st, pickled = _names(rank)
    if not (root / js).exists() and not (root / pickled).exists():  # more ranks than saved: rank 0's schedule
        js, st, pickled = _names(0)
    if not (root / js).exists() and (root / pickled).exists():
        raise refuse_pickle(root / pickled, "the FSDP backend's per-rank state (LR schedule, step, RNG)")
    extra = read_state_json(root / js)
    if not isinstance(extra, dict) or extra.get("format") != EXTRA_FORMAT or type(extra.get("step")) is not int:
        raise CheckpointError(f"checkpoint file {root / js}: expected a JSON object with \"format\": "
                              f"{EXTRA_FORMAT} and an integer \"step\"")
    if not (root / st).is_file():
        raise CheckpointError(f"checkpoint file {root / st} is missing")
    try:
        tensors = load_file(str(root / st))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {root / st} is not a safetensors file ({exc}); refusing to load "
                              "it") from None
    try:
        state = rng.join(extra.pop("rng", None), tensors, source=str(root / js))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    extra.pop("format")
    return extra, state


def save(path: str, model, optimizer, extra: dict, rank: int) -> None:
    """All ranks: DCP shards of model (and optimizer) plus this rank's extra state."""
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
    save_extra(path, rank, extra)
    dist.barrier()


def _agree(problem: str | None) -> None:
    """Raise :class:`CheckpointError` on every rank when any rank found a problem."""
    import torch.distributed as dist

    problems = [problem]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    found = [(r, p) for r, p in enumerate(problems) if p]
    if found:
        raise CheckpointError(found[0][1] if len(problems) == 1 else f"rank {found[0][0]}: {found[0][1]}")


def load(path: str, model, optimizer, rank: int) -> dict:
    """Restore model/optimizer in place; returns the rank's ``extra`` dict (RNG already set).
    All ranks call it; a refused file raises :class:`CheckpointError` on every rank."""
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
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        safe_dcp.load(state, root)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        state = {"model": get_model_state_dict(model)}
        safe_dcp.load(state, root)
        set_model_state_dict(model, state["model"])
    rng.set_state(rng_state)
    return extra

