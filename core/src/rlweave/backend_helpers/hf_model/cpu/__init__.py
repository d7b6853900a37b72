"""The HF model layer's CPU fast paths, behind one entry: :func:`prepare`.

A backend's worker calls :func:`prepare` once per model, after loading it and before compiling or
sharding it, on every device: it resolves the device-dependent choices (:mod:`.choices`) and,
on a CPU rank, applies them to that model alone:

* :mod:`.linear`: the wide linears' CPU-friendly weight gradient (``cpu.kernels``);
* :mod:`.rotary`: rotary embeddings as one autograd function (``cpu.kernels``), active only
  while this model's decoder layers run, so another model in the process keeps transformers'
  code;
* :mod:`.attention`: which CPU attention forward/backward each attention module runs
  (``cpu.attention_backward``, and fp32 attention on a CPU where bf16 is slow), kept in a
  registry keyed by module.

On CUDA nothing is applied; the returned choices still carry the device-independent ones
(``compile_scope``).
"""

from __future__ import annotations

import logging

from torch import nn

from rlweave.backend_helpers.hf_model.cpu import attention, linear, rotary
from rlweave.backend_helpers.hf_model.cpu.choices import DeviceChoices, resolve, role_bf16_speed, warning
from rlweave.backend_helpers.hf_model.options import PathOptions

__all__ = ["DeviceChoices", "prepare"]


def prepare(model: nn.Module, options: PathOptions, device: str, bf16_compute: bool, world_size: int, *,
            backend: str, dtype_name: str = "float32", role: str = "policy", rank: int = 0) -> DeviceChoices:
    """Resolve ``options``' device-dependent choices for a rank on ``device`` (``"cpu"`` or
    ``"cuda"``) of a ``world_size``-rank role computing in bf16 or not, and apply the CPU ones
    to ``model`` (see the module docstring). Collective when ``world_size > 1`` on a CPU
    computing in bf16 (every rank takes the slowest rank's bf16 speed): call it on every rank.
    On a CPU where bf16 is slow, rank 0 logs a warning naming the role (``dtype_name``: the
    model's dtype, named in it) to the logger ``rlweave.backend_<backend>``."""
    from rlweave.backend_helpers.hf_model.modeling import decoder_layers

    speed = role_bf16_speed(device, bf16_compute, world_size)
    choices = resolve(options, device, bf16_compute, speed)
    message = warning(choices, options, dtype_name, role, rank, backend=backend)
    if message and rank == 0:
        logging.getLogger(f"rlweave.backend_{backend}").warning(message)
    if device != "cpu":
        return choices
    layers = decoder_layers(model)
    if choices.kernels:
        linear.install(model)
        rotary.install(model, layers, compiled=options.compile)
    modes = attention.Modes(forward=choices.attention_forward, backward=choices.attention_backward)
    attention.set_modes([getattr(layer, "self_attn", None) for layer in layers], modes)
    return choices
