"""A backend rank's state that is not sharded, in a checkpoint directory: JSON and safetensors.

Per rank ``r``: ``extra_rank<r>.json`` (``{"format": 1, "step", "scheduler" (JSON values),
"rng": Python and NumPy RNG states}``) and ``extra_rank<r>.safetensors`` (the torch CPU
generator state and each CUDA device's, uint8 tensors), so a resumed run continues exactly.
Nothing is read as a pickle: a pickled ``extra_rank<r>.pt`` in its place raises
:class:`~rlweave.data.checkpoint_files.CheckpointError` naming it. :func:`agree` makes all ranks
refuse together when any rank found a problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlweave.data import rng_state as rng
from rlweave.data.checkpoint_files import CheckpointError, read_state_json, refuse_pickle, write_json

EXTRA_FORMAT = 1


def _names(rank: int) -> tuple[str, str, str]:
    return f"extra_rank{rank}.json", f"extra_rank{rank}.safetensors", f"extra_rank{rank}.pt"


def save_extra(path: str | Path, rank: int, extra: dict[str, Any], backend: str = "fsdp") -> None:
    """Write ``extra`` (JSON values: ``step``, ``scheduler`` ...) and this process's RNG
    states as ``extra_rank<rank>.json`` + ``.safetensors`` into ``path``."""
    from safetensors.torch import save_file

    rng_json, tensors = rng.split(rng.get_state())
    js, st, _ = _names(rank)
    try:
        write_json(Path(path) / js, {**extra, "format": EXTRA_FORMAT, "rng": rng_json})
    except TypeError as exc:
        raise TypeError(f"{backend} backend: checkpoint extra state must be JSON values: {exc}") from None
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
        raise refuse_pickle(root / pickled, "a training backend's per-rank state (LR schedule, step, RNG)")
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


def agree(problem: str | None) -> None:
    """Raise :class:`CheckpointError` on every rank when any rank found a problem."""
    import torch.distributed as dist

    problems = [problem]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    found = [(r, p) for r, p in enumerate(problems) if p]
    if found:
        raise CheckpointError(found[0][1] if len(problems) == 1 else f"rank {found[0][0]}: {found[0][1]}")


