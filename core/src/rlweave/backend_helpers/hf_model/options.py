"""Options of the HF model layer that backends put in their own ``roles.<role>.options``
(pydantic, light: no torch): the CPU fast paths (:class:`CPUOptions`), and what
:mod:`.cpu` reads of a backend's options (:class:`PathOptions`)."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field


class CPUOptions(BaseModel):
    """``roles.<role>.options.cpu``: the CPU fast paths (:mod:`rlweave.backend_helpers.hf_model.cpu`)."""

    model_config = ConfigDict(extra="forbid")

    kernels: Literal["auto", "rlweave", "torch"] = Field(
        "auto", description="'rlweave': CPU fast paths: rotary embeddings as one autograd function in the projections' "
        "layout, and the weight gradients of Llama-style MLP projections and the LM head with their narrower operand "
        "transposed first (the layout oneDNN's bf16 weight-gradient matmul runs fast); 'torch': transformers' "
        "code as is. auto: rlweave on CPU with bf16 compute where this CPU runs bf16 fast (probed: "
        "rlweave.devices.cpu), torch elsewhere. Applies to this role's model only.",
    )
    attention_backward: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="CPU attention backward with bf16 compute: 'fp32' runs PyTorch's flash kernel in fp32; 'bf16' "
        "recomputes the probabilities and runs bf16 matmuls around an fp32 softmax gradient, compiled by inductor "
        "(faster where the CPU has fast bf16 matmuls: bench/RESULTS.md; gradients within bf16 rounding, as on GPU). "
        "auto: bf16 when compile is on, kernels resolves to rlweave and this CPU runs bf16 fast, else fp32.",
    )


class PathOptions(Protocol):
    """The options :func:`.cpu.prepare` and :func:`.cpu.choices.resolve` read: ``cpu``
    (:class:`CPUOptions`), ``mixed_precision`` (``none`` or ``bf16``), ``compile`` and
    ``compile_scope`` (``auto``, ``layer`` or ``mlp_norms``). The FSDP backend's options have
    them all; a backend without compilation passes :class:`FixedPaths`."""

    cpu: CPUOptions
    mixed_precision: str
    compile: bool
    compile_scope: str


class FixedPaths(BaseModel):
    """:class:`PathOptions` of a backend whose options set only ``cpu`` and
    ``mixed_precision`` (nothing compiled)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: CPUOptions = Field(default_factory=CPUOptions)
    mixed_precision: Literal["none", "bf16"] = "none"
    compile: bool = False
    compile_scope: Literal["auto", "layer", "mlp_norms"] = "auto"
