"""DeepSpeed checkpoints that load at any world size: full fp32 tensors, no pickles.

A checkpoint directory holds:

* ``deepspeed.json``: ``{"format": 1, "zero_stage", "world_size", "optimizer_step" (AdamW's
  step count), "files": {"model": [...], "optim": [...]}}``;
* ``model-<i>.safetensors``: every trainable parameter's full fp32 master value under its
  parameter name (the ZeRO optimizer's copy, not the bf16 one the model computes with);
* ``optim-<i>.safetensors``: AdamW's ``exp_avg.<name>`` and ``exp_avg_sq.<name>``, full;
* per rank ``r``: ``extra_rank<r>.json`` / ``.safetensors`` (step, LR schedule, RNG states;
  :mod:`rlweave.backend_helpers.extra_state`).

Saving gathers one parameter at a time over all ranks (DeepSpeed's tensor-fragment API,
``safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state``); rank 0 writes a file each
time its buffered tensors pass ``shard_bytes``. Loading reads each tensor on every rank and
sets this rank's fragment (and the model's own copy), so the ranks that load may be more or
fewer than those that saved; a rank beyond the saved ones takes rank 0's RNG state. The run
checksums every file (:mod:`rlweave.runner.manifest`); a file in another form raises
:class:`~rlweave.runner.checkpoint.CheckpointError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlweave.backend_helpers.extra_state import agree, read_extra, save_extra
from rlweave.data import rng_state as rng
from rlweave.data.checkpoint_files import CheckpointError, write_json

FORMAT = 1
INDEX = "deepspeed.json"
MOMENTS = ("exp_avg", "exp_avg_sq")


class _Writer:
    """Rank 0's buffer of tensors, written as ``<prefix>-<i>.safetensors`` every ``limit`` bytes."""

    def __init__(self, root: Path, prefix: str, limit: int, rank: int):
        self.root, self.prefix, self.limit, self.rank = root, prefix, limit, rank
        self.buf: dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: list[str] = []

    def add(self, name: str, t: torch.Tensor) -> None:
        if self.rank != 0:
            return
        self.buf[name] = t.detach().to("cpu", copy=True).contiguous()
        self.size += t.numel() * t.element_size()
        if self.size >= self.limit:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if self.rank != 0 or not self.buf:
            return
        name = f"{self.prefix}-{len(self.files):05d}.safetensors"
        save_file(self.buf, str(self.root / name))
        self.files.append(name)
        self.buf, self.size = {}, 0


def optimizer_step(base) -> int:
    """AdamW's step count in ``base`` (the torch optimizer of the flat partitions); 0 before the first step."""
    for st in base.state.values():
        if "step" in st:
            return int(float(st["step"]))
    return 0


def save(path: str, model: torch.nn.Module, base, extra: dict, rank: int, zero_stage: int,
         shard_bytes: int, backend: str = "deepspeed") -> None:
    """All ranks: write the checkpoint of ``model`` (parameters of the engine's ZeRO optimizer)
    and ``base`` (its torch AdamW; None for a role without an optimizer) into ``path``."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    weights = _Writer(root, "model", shard_bytes, rank)
    moments = _Writer(root, "optim", shard_bytes, rank)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        weights.add(name, safe_get_full_fp32_param(p))
        if base is not None:
            for key in MOMENTS:
                moments.add(f"{key}.{name}", safe_get_full_optimizer_state(p, key))
    weights.flush()
    moments.flush()
    if rank == 0:
        write_json(root / INDEX, {"format": FORMAT, "zero_stage": zero_stage, "world_size": dist.get_world_size(),
                                  "optimizer_step": optimizer_step(base) if base is not None else 0,
                                  "files": {"model": weights.files, "optim": moments.files}})
    save_extra(root, rank, extra, backend)
    dist.barrier()


def _index(root: Path) -> dict[str, Any]:
    f = root / INDEX
    try:
        data = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{f}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        raise CheckpointError(f"{f}: not a deepspeed backend checkpoint index of format {FORMAT}")
    for kind in ("model", "optim"):
        for name in data["files"].get(kind, []):
            if not (isinstance(name, str) and "/" not in name and name.endswith(".safetensors")
                    and (root / name).is_file()):
                raise CheckpointError(f"{f}: lists {name!r}, which is not a safetensors file of {root}")
    return data


class _Tensors:
    """The tensors of a checkpoint's safetensors files by name, each file opened once (until
    :meth:`close`). Raises CheckpointError naming a file that is not readable safetensors."""

    def __init__(self, root: Path, files: list[str]):
        from contextlib import ExitStack

        from safetensors import SafetensorError, safe_open

        self.root, self.where, self._files = root, {}, ExitStack()
        for name in files:
            try:
                f = self._files.enter_context(safe_open(str(root / name), framework="pt"))
            except (OSError, SafetensorError) as exc:
                self.close()
                raise CheckpointError(f"{root / name}: not a readable safetensors file ({exc})") from None
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not a dict
                self.where[key] = f

    def read(self, key: str) -> torch.Tensor:
        if key not in self.where:
            raise CheckpointError(f"{self.root}: the checkpoint has no tensor {key!r}")
        return self.where[key].get_tensor(key)

    def close(self) -> None:
        self._files.close()


def flat_partitions(zero_optimizer) -> list[torch.Tensor]:
    """The fp32 flat partitions this rank's AdamW updates (ZeRO-3 keeps them out of the
    optimizer's param_groups between steps)."""
    for attr in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        flats = getattr(zero_optimizer, attr, None)
        if flats:
            return list(flats)
    return [p for g in zero_optimizer.optimizer.param_groups for p in g["params"]]


def _init_moments(zero_optimizer, step: int) -> None:
    """Create AdamW's state for every flat partition (torch creates it at the first step) so
    the loaded moments have somewhere to go; ``step`` is AdamW's step count."""
    base = zero_optimizer.optimizer
    on_device = bool(base.defaults.get("fused") or base.defaults.get("capturable"))
    for fp in flat_partitions(zero_optimizer):
        st = base.state[fp]
        for key in MOMENTS:
            if key not in st:
                st[key] = torch.zeros_like(fp, memory_format=torch.preserve_format)
        st["step"] = torch.tensor(float(step), dtype=torch.float32, device=fp.device if on_device else "cpu")


def _restore(model: torch.nn.Module, zero_optimizer, weights: _Tensors, moments: _Tensors, rank: int, zero3: bool,
             step: int) -> None:
    """Set every trainable parameter's fp32 master value, AdamW moments (``step``: AdamW's step
    count) and the model's own copy from the checkpoint's full tensors."""
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    base = getattr(zero_optimizer, "optimizer", None)
    if base is not None:
        _init_moments(zero_optimizer, step)
        # ZeRO-1/2 map each parameter to its piece of the AdamW state once that state exists
        link = getattr(zero_optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:
            link()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        value = weights.read(name)
        if base is not None:
            safe_set_full_fp32_param(p, value)
            for key in MOMENTS:
                safe_set_full_optimizer_state(p, moments.read(f"{key}.{name}"), key)
        if zero3:
            with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                if rank == 0:
                    p.data.copy_(value.to(p.dtype))
        else:
            with torch.no_grad():
                p.data.copy_(value.to(p.dtype))


def load(path: str, model: torch.nn.Module, zero_optimizer, rank: int, zero3: bool) -> dict:
    """All ranks: restore what :func:`save` wrote into ``model`` and ``zero_optimizer`` (the
    engine's ZeRO optimizer; None for a role without one; see the module docstring); returns
    this rank's extra state (RNG already set). A refused file raises :class:`CheckpointError`
    on every rank."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"deepspeed backend: checkpoint {path} does not exist (rank {rank})")
    problem, data, weights, moments, extra, rng_state = None, {}, None, None, {}, {}
    try:
        data = _index(root)
        weights = _Tensors(root, data["files"].get("model", []))
        moments = _Tensors(root, data["files"].get("optim", []) if zero_optimizer is not None else [])
        mine = rank if (root / f"extra_rank{rank}.json").exists() or rank < int(data.get("world_size", 1)) else 0
        extra, rng_state = read_extra(root, mine)
    except CheckpointError as exc:
        problem = str(exc)
    try:
        agree(problem)
        _restore(model, zero_optimizer, weights, moments, rank, zero3, int(data.get("optimizer_step", 0)))
    finally:
        for files in (weights, moments):
            if files is not None:
                files.close()
    dist.barrier()
    rng.set_state(rng_state)
    return extra
