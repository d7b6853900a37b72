"""Grouped MoE experts: the whole experts computation of one MoE layer, one grouped matmul per
projection.

Given ``T`` tokens each routed to ``k`` experts with routing weights (already softmaxed and,
where the model says so, renormalised by its router), the experts output is

    out[t] = sum_j w[t, j] * down[e] @ (act(gate) * up),   gate, up = (gate_up[e] @ x[t]).chunk(2)
             with e = top_k_index[t, j]

which is the math of the Hugging Face experts modules (``Qwen3MoeExperts``, ``Qwen2MoeExperts``,
``MixtralExperts``): ``gate_up`` is ``(E, 2I, H)``, ``down`` is ``(E, H, I)``. The grouped path
sorts the (token, choice) pairs by expert (:mod:`.routing`), runs ``gate_up`` and ``down`` as
one grouped matmul each over all experts (:mod:`.torch_grouped` or :mod:`.triton_grouped`), and
sums each token's outputs back weighted by its routing weights. Autograd flows through all of
it: hidden states, routing weights and both weight tensors.

Implementations (``impl``): ``"torch"`` (torch's ``grouped_mm``), ``"triton"`` (own Triton
kernels, CUDA), ``"reference"`` (a plain per-expert loop, :mod:`.reference`). When a call
cannot take the asked path (a shape breaking ``grouped_mm``'s 16-byte rule, a dtype the device's
kernel lacks, CPU tensors for Triton), it runs the reference instead, logs the reason once
and counts it in :func:`fallbacks`: slower, never wrong.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import torch

from rlweave_kernel_moe import routing as routing_mod
from rlweave_kernel_moe import torch_grouped
from rlweave_kernel_moe.dtypes import compute_dtype
from rlweave_kernel_moe.reference import reference_experts

IMPLEMENTATIONS = ("triton", "torch", "reference")

log = logging.getLogger(__name__)
_FALLBACKS: collections.Counter[str] = collections.Counter()


def fallbacks() -> dict[str, int]:
    """``{reason: calls}`` of the calls that ran the reference instead of the asked path."""
    return dict(_FALLBACKS)


def _fall_back(reason: str) -> None:
    if reason not in _FALLBACKS:
        log.warning("moe_groupgemm: running the per-expert reference: %s", reason)
    _FALLBACKS[reason] += 1


def problem(impl: str, device_type: str, dtype: torch.dtype, hidden_size: int, intermediate_size: int) -> str | None:
    """Why ``impl`` cannot run experts of this shape and dtype on ``device_type``, or None."""
    if impl == "reference":
        return None
    if impl == "torch":
        return (torch_grouped.layout_problem(hidden_size, intermediate_size, dtype)
                or torch_grouped.device_problem(device_type, dtype))
    if impl == "triton":
        from rlweave_kernel_moe import triton_grouped

        return triton_grouped.problem(device_type, dtype)
    raise ValueError(f"unknown MoE experts implementation {impl!r}; choose one of {', '.join(IMPLEMENTATIONS)}")


def grouped_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, act_fn: Callable[[torch.Tensor], torch.Tensor],
                    impl: str) -> torch.Tensor:
    """The experts output ``(T, H)`` in ``hidden``'s dtype.

    Args:
        hidden: ``(T, H)`` hidden states.
        top_k_index: ``(T, k)`` integer, the experts of each token, in ``[0, E)``.
        top_k_weights: ``(T, k)`` routing weights.
        gate_up: ``(E, 2I, H)`` stacked gate and up projections (gate first).
        down: ``(E, H, I)`` stacked down projections.
        act_fn: activation applied to the gate half.
        impl: ``"torch"``, ``"triton"`` or ``"reference"`` (see the module docstring).
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown MoE experts implementation {impl!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    dtype = compute_dtype(hidden, gate_up)
    reason = problem(impl, hidden.device.type, dtype, gate_up.shape[2], down.shape[2])
    if reason is not None:
        _fall_back(reason)
        impl = "reference"
    if impl == "reference":
        return reference_experts(hidden, top_k_index, top_k_weights, gate_up, down, act_fn)

    if impl == "triton":
        from rlweave_kernel_moe.triton_grouped import grouped_linear
    else:
        grouped_linear = torch_grouped.grouped_linear
    routing = routing_mod.route(top_k_index, gate_up.shape[0])
    x = routing_mod.permute(hidden.to(dtype), routing)                  # (S, H), rows sorted by expert
    gate, up = grouped_linear(x, gate_up.to(dtype), routing.offsets).chunk(2, dim=-1)
    y = grouped_linear(act_fn(gate) * up, down.to(dtype), routing.offsets)  # (S, H)
    return routing_mod.unpermute(y, top_k_weights, routing, hidden.dtype)
