"""How the FSDP backend turns a loaded Hugging Face model into a trainable rank: one named
step per concern, in the order :meth:`FSDPWorker.init_model` applies them.

1. :func:`apply_moe_kernel`: the ``moe_groupgemm`` kernel replaces the experts' forward
   (same parameters);
2. :func:`apply_sequence_parallel`: checks the attention heads split over the ``sp`` group
   (the split itself happens per forward, :mod:`.sequence_parallel`);
3. :func:`apply_cpu_paths`: the CPU fast paths and device-dependent choices
   (:mod:`rlweave.backend_helpers.hf_model.cpu`; a step of the shared HF model layer);
4. :func:`apply_activation_checkpointing` (the HF model layer's too);
5. :func:`apply_lora`: PEFT adapters wrap the targeted linear layers (:mod:`.lora`);
6. :func:`apply_compile`: ``torch.compile`` of parts of each decoder layer, in place;
7. :func:`apply_fsdp`: FSDP2 ``fully_shard`` of each decoder layer, then of the model.

Every step before :func:`apply_fsdp` changes modules in place or wraps them, so parameter
names and the decoder layers found before stay valid; sharding comes last, as FSDP2 expects.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlweave.backend_helpers.hf_model.prepare import apply_activation_checkpointing, apply_cpu_paths  # noqa: F401
from rlweave_backend_fsdp import checks, lora, moe


def apply_moe_kernel(model: nn.Module, blocks: list, ctx: Any, device_type: str, rank: int) -> dict | None:
    """When the role selected the ``moe_groupgemm`` kernel, swap the experts' forward of
    ``blocks`` (before sharding; same parameters). Returns the kernel's report, or None."""
    return moe.apply_kernel(model, ctx.kernel(moe.KERNEL_NAME), device_type, blocks, role=ctx.role, rank=rank)


def apply_sequence_parallel(model: nn.Module, sp: int) -> list[tuple[str, str]]:
    """Problems (``(key, message)``) with splitting ``model``'s attention heads over an ``sp``
    group; none for ``sp == 1``."""
    if sp <= 1:
        return []
    c = getattr(model.config, "text_config", None) or model.config  # a vision-language model's decoder
    heads = (c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
    return checks.sp_problems(sp, {}, heads)


def apply_lora(model: nn.Module, section: Any, kind: str, role: str) -> nn.Module:
    """``model`` with PEFT adapters on the targets of ``section`` (a role's ``lora``), or
    ``model`` itself without one."""
    return model if section is None else lora.apply_lora(model, section, kind, role)


def compile_units(layer: nn.Module, scope: str) -> list[nn.Module]:
    """What ``compile`` compiles in one decoder layer: the layer itself (``layer``), or its
    children other than the attention block (``mlp_norms``: norms and MLP in Llama-style
    layers)."""
    if scope == "layer":
        return [layer]
    if scope != "mlp_norms":
        raise ValueError(f"fsdp backend: compile_scope {scope!r}; choose auto, layer or mlp_norms")
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        raise ValueError(f"fsdp backend: compile_scope mlp_norms: {type(layer).__name__} has no self_attn; use layer")
    return [m for m in layer.children() if m is not attn]


def apply_compile(layers: list[nn.Module], enabled: bool, scope: str) -> None:
    """``torch.compile`` (dynamic shapes) the units of ``scope`` in each decoder layer, in place
    (same parameter names)."""
    if not enabled:
        return
    for layer in layers:
        for part in compile_units(layer, scope):
            part.compile(dynamic=True)


def apply_fsdp(model: nn.Module, layers: list[nn.Module], device_type: str, world_size: int,
               mixed_precision: str | None, reshard_after_forward: bool | None,
               units: list[nn.Module] = ()) -> None:
    """FSDP2-shard each of ``units`` (modules called on their own, such as a vision tower) and
    each decoder layer, then the model, over a 1-D mesh of ``world_size`` ranks.
    ``mixed_precision: bf16`` computes in bf16 and reduces gradients in fp32;
    ``reshard_after_forward`` None: reshard unless one rank holds everything anyway (then
    backward skips the re-gather)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {"mesh": init_device_mesh(device_type, (world_size,)),
                          "reshard_after_forward": world_size > 1 if reshard_after_forward is None
                          else reshard_after_forward}
    if mixed_precision == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in [*units, *layers]:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)


def first_forward(model: nn.Module, device) -> None:
    """A 2-token forward through the sharded root, then every unit resharded: FSDP sets its state up
    at the root's first forward, so a unit called on its own before the root (a vision tower) needs
    it done first; resharding leaves the parameters the optimizer will hold in place."""
    from torch.distributed.fsdp import FSDPModule

    with torch.no_grad():
        model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device), use_cache=False)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
