"""LoRA adapters on the FSDP backend, built with PEFT (``roles.<role>.lora``).

:func:`apply_lora` wraps the model in a ``PeftModel`` before sharding: the targeted linear layers
get ``lora_A``/``lora_B`` (B starts at zero, so the model starts as its base), only they and the
``modules_to_save`` copies require gradients, and the optimizer holds only those
(:func:`trainable`). A value or reward model trains its ``score`` head in full as well.

Weights leave merged, under the base model's names (:func:`merged_items`): each adapted
``W`` is gathered and ``W + alpha/r * B @ A`` is computed on the full tensors (B and A are small),
so no rank holds more than one full weight at a time; a ``modules_to_save`` copy replaces the
original. :func:`adapter_items` yields the adapter in PEFT's own file names, for a directory
``PeftModel.from_pretrained`` loads. :func:`adapters_disabled` gives the base model exactly (the
reference without a reference role).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from rlweave_backend_fsdp.hf_export import full as _full

#: prefix PEFT puts before the wrapped model's parameter names
PREFIX = "base_model.model."
_HEADS = {"value": ["score"], "reward": ["score"]}


#: linear layers ``all-linear`` leaves out: the LM head and the value/score head (trained in full)
_NOT_ADAPTED = {"lm_head", "score"}


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (``q_proj``, ``lm_head``...), a
    vision-language model's vision tower left out (LoRA adapts its language model)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and name and not _in_tower(name)})


def _in_tower(name: str) -> bool:
    return name.startswith("visual.") or ".visual." in name


def _language_only(model: nn.Module, targets: list[str]) -> list[str] | str:
    """``targets`` (last names) for PEFT; for a model with a vision tower, a pattern matching those
    names outside the tower only."""
    import re

    if not any(_in_tower(name) for name, _ in model.named_modules()):
        return targets
    names = "|".join(re.escape(t) for t in targets)
    return rf"^(?!(?:.*\.)?visual\.).*(?:^|\.)(?:{names})$"


def router_names(model: nn.Module) -> set[str]:
    """Last names of the linear children of mixture-of-experts blocks (modules with ``experts``):
    routers and shared-expert gates, which ``all-linear`` leaves out."""
    out = set()
    for name, m in model.named_modules():
        if hasattr(m, "experts"):
            out.update(child for child, c in m.named_children() if isinstance(c, nn.Linear))
    return out


def resolve_targets(model: nn.Module, targets: Any) -> list[str]:
    """``target_modules`` as the linear layers' last names: ``all-linear`` is every linear layer
    but the heads and the linear children of MoE blocks (:func:`router_names`). Experts stored as
    stacked tensors are no linear layers and get no adapters (they stay as loaded); a shared
    expert's projections do."""
    from rlweave.interfaces.lora import ALL_LINEAR

    if targets == ALL_LINEAR:
        left_out = _NOT_ADAPTED | router_names(model)
        return [n for n in linear_names(model) if n not in left_out]
    return list(targets)


def target_problems(model: nn.Module, targets: Any, to_save: list[str]) -> list[str]:
    """Messages for each ``target_modules`` / ``modules_to_save`` name no module of ``model`` has."""
    from rlweave.interfaces.lora import ALL_LINEAR

    out = []
    linear = linear_names(model)
    if targets != ALL_LINEAR:
        for t in targets:
            if t not in linear:
                out.append(f"target_modules: no linear layer named {t!r}; the model's linear layers are: "
                           f"{', '.join(linear)}")
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
    for t in to_save:
        if t not in names:
            out.append(f"modules_to_save: the model has no module named {t!r}")
    return out


def apply_lora(model: nn.Module, section: Any, kind: str, role: str) -> nn.Module:
    """``model`` as a ``PeftModel`` with the adapters of ``section`` (a ``LoRASection``).
    Raises ValueError naming ``roles.<role>.lora.<key>`` for a module name the model lacks."""
    from peft import LoraConfig, get_peft_model

    to_save = list(dict.fromkeys(list(section.modules_to_save) + _HEADS.get(kind, [])))
    problems = target_problems(model, section.target_modules, to_save)
    if problems:
        raise ValueError(f"fsdp backend: role {role}: " + "; ".join(f"roles.{role}.lora.{p}" for p in problems))
    cfg = LoraConfig(r=section.r, lora_alpha=section.alpha, lora_dropout=section.dropout,
                     target_modules=_language_only(model, resolve_targets(model, section.target_modules)),
                     modules_to_save=to_save or None,
                     bias="none")
    base_path = getattr(getattr(model, "config", None), "_name_or_path", None)
    peft_model = get_peft_model(model, cfg)
    if base_path:
        peft_model.peft_config["default"].base_model_name_or_path = base_path
    return peft_model


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def base_of(model: nn.Module) -> nn.Module:
    """The wrapped transformers model of a ``PeftModel`` (``model`` itself otherwise)."""
    return model.get_base_model() if is_peft(model) else model


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model: every adapter layer and ``modules_to_save`` copy switched off.

    Only the layers' switch is flipped. PEFT's ``disable_adapter()`` also turns the adapters'
    ``requires_grad`` off and back on, which under FSDP2 reaches whichever parameter objects
    (sharded or unsharded) the modules hold at that moment and can leave the optimizer's
    sharded parameters frozen."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    layers = [m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, was in zip(layers, before):
            m._disable_adapters = was


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _scaling(model: nn.Module) -> dict[str, float]:
    """Module name (state-dict prefix) -> ``alpha / r`` of each adapted layer."""
    from peft.tuners.lora import LoraLayer

    return {f"{name}.": float(m.scaling["default"]) for name, m in model.named_modules()
            if isinstance(m, LoraLayer) and "default" in m.scaling}


def merged_items(model: nn.Module, skip: set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(base-model name, full merged tensor, local tensor)`` for every weight of the model
    whose base-model name is not in ``skip``.

    All ranks iterate together (each full tensor is a collective); the merged value is computed
    in fp32 and returned in the weight's dtype. ``local`` is the rank's own tensor of that name
    (for callers that must not alias it)."""
    sd = model.state_dict()
    scale = _scaling(model)
    for name, t in sd.items():
        if ".lora_A." in name or ".lora_B." in name or ".original_module." in name:
            continue
        out = name.removeprefix(PREFIX)
        if out.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".") in skip:
            continue
        if ".base_layer." in name:
            mod = name.split(".base_layer.")[0]
            out = out.replace(".base_layer.", ".")
            full = _full(t)
            if name.endswith(".weight") and f"{mod}.lora_A.default.weight" in sd:
                a = _full(sd[f"{mod}.lora_A.default.weight"]).float()
                b = _full(sd[f"{mod}.lora_B.default.weight"]).float()
                full = (full.float() + scale[f"{mod}."] * (b @ a)).to(t.dtype)
            yield out, full, t
        elif ".modules_to_save.default." in name:
            yield out.replace(".modules_to_save.default.", "."), _full(t), t
        else:
            yield out, _full(t), t


def adapter_items(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(PEFT file name, full tensor)`` of the adapter weights (and ``modules_to_save``) as
    ``PeftModel.save_pretrained`` names them; all ranks iterate together."""
    from peft import get_peft_model_state_dict

    sd = model.state_dict()
    keep = [n for n in sd if ".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n]
    full = {n: _full(sd[n]).detach().cpu().clone() for n in keep}
    yield from get_peft_model_state_dict(model, state_dict=full).items()


def write_adapter(path: str, model: nn.Module, items: dict[str, torch.Tensor]) -> None:
    """Rank 0: ``path`` as ``PeftModel.save_pretrained`` writes it, from the gathered ``items``."""
    from pathlib import Path

    from safetensors.torch import save_file

    Path(path).mkdir(parents=True, exist_ok=True)
    model.peft_config["default"].save_pretrained(path)
    save_file({k: v.contiguous() for k, v in items.items()}, str(Path(path) / "adapter_model.safetensors"),
              metadata={"format": "pt"})
