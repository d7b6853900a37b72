"""Full weights out of a sharded model: streaming and Hugging Face export.

Streaming gathers one parameter at a time (``DTensor.full_tensor()``, a collective every
rank joins) and only rank 0 keeps it, so no rank ever holds more than one full tensor
beyond its shard. Names are the HF checkpoint names: the FSDP2 module keeps the original
names, and stacked MoE experts are split per expert (:mod:`.moe_layout`).

Export layout:

* ``causal_lm``: the model's own config + ``model*.safetensors`` (tied ``lm_head.weight``
  left out, as transformers does) -> loads with ``AutoModelForCausalLM`` and vLLM.
* ``reward``: ``model.*`` + ``score.weight`` with ``architectures=[<Arch>ForSequenceClassification]``
  and ``num_labels=1`` -> ``AutoModelForSequenceClassification`` (score at the last token).
* ``value``: same names plus a zero ``score.bias``, ``architectures=[<Arch>ForTokenClassification]``.

A critic is initialised from a reward model simply by pointing its ``model.path`` at the
reward model's export: the backbone and ``score.weight`` are loaded (:mod:`.modeling`).
"""

from __future__ import annotations

from typing import Iterator

import torch

from rlweave.backend_helpers.hf_dir import TOKENIZER_FILES, write_hf  # noqa: F401 - re-exported
from rlweave_backend_fsdp.moe_layout import CheckpointLayout


def full(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole: a sharded DTensor gathered (a collective every rank joins), else ``t`` itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _plain_items(model: torch.nn.Module, skip: set[str]) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    for name, t in model.state_dict().items():
        if name not in skip:
            yield name, full(t), t


def stream_full(model: torch.nn.Module, rank: int, skip: set[str], dtype=None, device="cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """All ranks iterate; rank 0 yields ``(name, full tensor)`` parameter by parameter, in
    checkpoint names: stacked MoE experts come out one matrix per expert, each its own copy
    (:mod:`.moe_layout`; raises ValueError for an MoE layout it does not know). A model with LoRA
    adapters comes out merged, under its base model's names (:func:`.lora.merged_items`)."""
    from torch.distributed.tensor import DTensor

    from rlweave_backend_fsdp import lora

    layout = CheckpointLayout(lora.base_of(model))
    items = lora.merged_items(model, skip) if lora.is_peft(model) else _plain_items(model, skip)
    for name, full, t in items:
        if rank == 0:
            src = full.detach()
            local = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage().data_ptr()
            for out_name, part in layout.split(name, src):
                to = dtype if dtype is not None and part.is_floating_point() else part.dtype
                if part is src:
                    out = part.to(to).to(device).contiguous()
                    # one rank: the "full" tensor may be the parameter itself; yield a snapshot
                    yield out_name, (out.clone() if out.untyped_storage().data_ptr() == local else out)
                else:  # a per-expert slice is copied: a consumer keeping it must not pin the stacked tensor
                    yield out_name, part.to(device=device, dtype=to, copy=True).contiguous()
            del src
        del full


def export_config(model: torch.nn.Module, kind: str, dtype: torch.dtype):
    """The HF config to save for ``model`` (:func:`rlweave.backend_helpers.hf_dir.export_config`)."""
    from rlweave.backend_helpers.hf_dir import export_config as _export

    from rlweave_backend_fsdp import lora

    model = lora.base_of(model)
    return _export(model.config, kind, dtype, type(model.model).__name__ if kind != "causal_lm" else None)
