"""Steps that turn a loaded Hugging Face model into what a backend trains, shared by the
backends that run HF models (each backend lists them among its own ``apply_*`` steps, before
it shards or wraps the model): the CPU fast paths and activation checkpointing."""

from __future__ import annotations

from typing import Any

from torch import nn

from rlweave.backend_helpers.hf_model import cpu
from rlweave.backend_helpers.hf_model.options import PathOptions


def apply_cpu_paths(model: nn.Module, options: PathOptions, device_type: str, bf16: bool, world_size: int, *,
                    backend: str, **kw: Any) -> cpu.DeviceChoices:
    """The device-dependent choices, with the CPU paths applied to ``model`` on a CPU rank
    (:func:`.cpu.prepare`; collective on CPU ranks computing in bf16)."""
    return cpu.prepare(model, options, device_type, bf16, world_size, backend=backend, **kw)


def apply_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant) when ``enabled``."""
    if enabled:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
