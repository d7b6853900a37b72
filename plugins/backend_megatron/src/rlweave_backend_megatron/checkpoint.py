"""Checkpoints of the megatron backend with torch.distributed.checkpoint (DCP), reshardable.

Every entry is keyed by its *global* megatron name (layer index counted over the whole
model, not the stage), so a checkpoint does not depend on the parallel layout it was saved
with: it loads into any ``tp`` / ``pp`` / ``dp`` / ``ep`` (the model's shape fixed).

* Tensor-parallel shards are DTensors over the tensor-parallel group (``Shard(0)`` for
  column-parallel rows, ``Shard(1)`` for row-parallel columns); ``linear_fc1`` is saved as
  two entries, ``#gate`` and ``#up``, each split by rows, since the fused layout depends on
  ``tp``. DCP writes each shard once (data-parallel copies are deduplicated) and reads any
  other split back.
* Stacked experts (:mod:`.moe`) are DTensors over the expert-parallel group (``Shard(0)``: each
  rank's experts), so a checkpoint loads into any ``ep``.
* The embedding and output rows are saved without their padding (which depends on ``tp``),
  gathered over the stage's tensor-parallel ranks: the one place a full tensor is held.
* With fp32 master weights (:mod:`.master`) the masters are saved as the parameters (so a
  checkpoint of a bf16 run holds fp32 weights and loads into any precision).
* AdamW's ``exp_avg`` / ``exp_avg_sq`` follow their parameter under ``optim/<key>/...``, written
  by the rank that owns it when the optimizer is sharded (:mod:`.zero`) and read by the owner in
  the loading layout;
  its step count is ``optim/step``.
* Step, LR schedule and RNG states are per-rank JSON + safetensors
  (:mod:`rlweave.backend_helpers.extra_state`); loading reads nothing as a pickle
  (:mod:`rlweave.backend_helpers.safe_dcp`).

Saving refuses, on every rank and before anything is written, when a parameter or optimizer
state of any rank is not finite (:class:`FloatingPointError` naming rank and tensor).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rlweave_backend_megatron import convert

if TYPE_CHECKING:  # pragma: no cover
    from rlweave_backend_megatron.worker import MegatronWorker

_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")
_STATES = ("exp_avg", "exp_avg_sq")


def _mesh(w: "MegatronWorker"):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(w._tp_group(), w.device.type)


def _entries(w: "MegatronWorker", tensor_of, owned: bool = False) -> dict[str, Any]:
    """``{key: value}`` of every local parameter (``owned``: those this rank's optimizer steps),
    where ``tensor_of(param)`` is the local tensor to save or fill (the parameter, or one of its
    optimizer states)."""
    from torch.distributed.tensor import DTensor, Shard

    mesh = _mesh(w) if w.tp > 1 else None
    emesh = _expert_mesh(w) if w.ep > 1 else None
    out: dict[str, Any] = {}
    for name, p in w.model.named_parameters():
        gname = w.global_name(name)
        if w.stages.is_tied_copy(name) or (owned and not w.owns(name)):
            continue
        local = tensor_of(p)
        how = convert.split_kind(gname)
        if gname in _VOCAB:
            out[gname] = _Vocab(local)
        elif convert.is_expert(gname) and emesh is not None:
            out[gname] = DTensor.from_local(local, emesh, [Shard(0)], run_check=False)
        elif how == "gate_up":
            gate, up = local.chunk(2, dim=0)
            for part, t in (("gate", gate), ("up", up)):
                out[f"{gname}#{part}"] = DTensor.from_local(t, mesh, [Shard(0)], run_check=False) if mesh else t
        elif how in ("rows", "cols") and mesh is not None:
            out[gname] = DTensor.from_local(local, mesh, [Shard(0 if how == "rows" else 1)], run_check=False)
        else:
            out[gname] = local
    return out


def _expert_mesh(w: "MegatronWorker"):
    from megatron.core import parallel_state as ps
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(ps.get_expert_model_parallel_group(), w.device.type)


class _Vocab:
    """A vocabulary-split tensor: saved and loaded whole, without padding rows."""

    def __init__(self, local: torch.Tensor):
        self.local = local


def _vocab_full(w: "MegatronWorker", local: torch.Tensor) -> torch.Tensor:
    if w.tp == 1:
        return local[: w.shape.vocab].clone()
    parts = [torch.empty_like(local) for _ in range(w.tp)]
    dist.all_gather(parts, local.contiguous(), group=w._tp_group())
    return torch.cat(parts)[: w.shape.vocab].clone()


def _materialise(w: "MegatronWorker", entries: dict[str, Any]) -> dict[str, Any]:
    return {k: (_vocab_full(w, v.local) if isinstance(v, _Vocab) else v) for k, v in entries.items()}


def _opt_state(w: "MegatronWorker", p: torch.nn.Parameter, key: str) -> torch.Tensor:
    p = w.main(p)
    st = w.optimizer.state.setdefault(p, {})
    if key not in st:
        st[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return st[key]


def _state(w: "MegatronWorker", with_optim: bool) -> dict[str, Any]:
    state: dict[str, Any] = {"model": _entries(w, lambda p: w.main(p).detach())}
    if with_optim:
        for s in _STATES:
            state[f"optim/{s}"] = _entries(w, lambda p, s=s: _opt_state(w, p, s), owned=True)
    return state


def _first_nonfinite(w: "MegatronWorker") -> str | None:
    for name, p in w.model.named_parameters():
        p = w.main(p)
        if not torch.isfinite(p.detach()).all():
            return f"parameter {w.global_name(name)}"
        for k, v in (w.optimizer.state.get(p, {}) if w.optimizer is not None else {}).items():
            if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all():
                return f"optimizer state {k} of {w.global_name(name)}"
    return None


def _step_count(w: "MegatronWorker") -> float:
    for st in (w.optimizer.state.values() if w.optimizer is not None else []):
        if "step" in st:
            return float(st["step"])
    return 0.0


def save(w: "MegatronWorker", path: str) -> None:
    """All ranks: the DCP entries of this rank plus its step, LR schedule and RNG."""
    import torch.distributed.checkpoint as dcp

    from rlweave.backend_helpers.extra_state import save_extra

    w._refuse_nonfinite(path, _first_nonfinite(w))
    Path(path).mkdir(parents=True, exist_ok=True)
    steps = _step_count(w)
    with_optim = w.optimizer is not None and steps > 0
    state = {k: _materialise(w, v) for k, v in _state(w, with_optim).items()}
    if with_optim:
        state["optim/step"] = torch.tensor(steps)
    dcp.save(state, checkpoint_id=path)
    extra = {"step": w.step, "scheduler": w._schedule_state(),
             "layout": {"tp": w.tp, "pp": w.pp, "dp": w.dp, "ep": w.ep}, "optimizer_state": with_optim}
    save_extra(path, w.rank, extra, "megatron")
    dist.barrier()


def load(w: "MegatronWorker", path: str) -> None:
    """All ranks: restore parameters, AdamW state, step, LR schedule and RNG from ``path``
    (saved with any parallel layout of the same model)."""
    from rlweave.backend_helpers import safe_dcp
    from rlweave.backend_helpers.extra_state import agree, read_extra
    from rlweave.data import rng_state as rng
    from rlweave.data.checkpoint_files import CheckpointError

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"megatron backend: checkpoint {path} does not exist (rank {w.rank})")
    problem = None
    try:
        extra, rng_state = read_extra(root, w.rank)
        safe_dcp.read_metadata(root)
    except CheckpointError as exc:
        problem = str(exc)
    agree(problem)
    with_optim = bool(extra.get("optimizer_state")) and w.optimizer is not None
    entries = _state(w, with_optim)
    state = {k: _materialise(w, v) for k, v in entries.items()}
    if with_optim:
        state["optim/step"] = torch.tensor(0.0)
    safe_dcp.load(state, root)
    with torch.no_grad():
        for group, loaded in state.items():
            if group == "optim/step":
                continue
            for key, value in loaded.items():
                target = entries[group][key]
                if isinstance(target, _Vocab):
                    n = w.shape.vocab
                    full = torch.zeros(target.local.shape[0] * w.tp, *value.shape[1:], dtype=value.dtype)
                    full[:n] = value
                    target.local.copy_(convert.split("embedding.word_embeddings.weight", full, w.tp, w.tp_rank))
        tied = "embedding.word_embeddings.weight" if w.stages.first else "output_layer.weight"  # this stage's copy
        w.stages.copy_tied_from_first(w.optimizer if with_optim and w.owns(tied) else None, _STATES, w.main)
        if w.masters is not None:
            w.masters.copy_to_model()
    if with_optim:
        step = float(state["optim/step"])
        for name, p in w.model.named_parameters():
            if w.owns(name):
                w.optimizer.state[w.main(p)]["step"] = torch.tensor(step)
    w.step = int(extra.get("step", 0))
    w._load_schedule(extra.get("scheduler"))  # the optimizer's param groups are not saved
    rng.set_state(rng_state)
