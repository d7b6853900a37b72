"""The ``moe_groupgemm`` kernel object handed to backends (``KERNEL``).

A backend that uses the kernel calls, before wrapping the model for parallelism (FSDP2's
``fully_shard``)::

    from rlweave_kernel_moe.kernel import KERNEL
    info = KERNEL.apply(model, device="cuda")   # {"replaced": 48, "impl": "triton", ...}

:meth:`MoEGroupGemm.apply` gives every supported Hugging Face experts module an instance-level
``forward`` running :func:`rlweave_kernel_moe.experts.grouped_experts`. Parameters, their
names and the state-dict layout stay as they are, so checkpoints, HF export and FSDP2 sharding
are unaffected; at forward time the module's current ``gate_up_proj`` and ``down_proj`` are
read (under FSDP2: the unsharded tensors). :meth:`MoEGroupGemm.remove` undoes it.

A backend that builds its own MoE layers (megatron's expert-parallel block) calls
:meth:`MoEGroupGemm.run` on its stacked expert weights instead.
"""

from __future__ import annotations

import functools
import types

import torch

from rlweave_kernel_moe import experts, hf_experts, torch_grouped

_IMPL_ATTR = "_moe_groupgemm_impl"


def _grouped_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts forward installed by :meth:`MoEGroupGemm.apply` (bound to the module)."""
    return experts.grouped_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                                   self.act_fn, getattr(self, _IMPL_ATTR))


@functools.cache
def _triton_problem() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton does not import: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"GPU is sm{major}{minor}; the Triton kernels need sm80+"
    return None


class MoEGroupGemm:
    """Grouped MoE experts for Hugging Face MoE models (see the module docstring)."""

    name = "moe_groupgemm"
    implementations = experts.IMPLEMENTATIONS

    @staticmethod
    def _device_type(device: str | torch.device) -> str:
        return torch.device(device).type

    def implementation(self, device: str) -> str:
        """Which implementation runs on ``device`` (a device or device type: ``"cuda"``,
        ``"cpu"``...): ``"torch"`` where torch's ``grouped_mm`` works on that device (on an H200
        it ran faster than the Triton kernels, ``bench/moe_experts.py``), else ``"triton"`` on
        CUDA sm80+ when triton imports, else ``"reference"``."""
        return next(impl for impl in ("torch", "triton", "reference") if self.why_not(impl, device) is None)

    def why_not(self, impl: str, device: str) -> str | None:
        """Why ``impl`` cannot run on ``device``, or None."""
        device_type = self._device_type(device)
        if impl == "triton":
            return _triton_problem() if device_type == "cuda" else f"the Triton kernels need CUDA (got {device_type})"
        if impl == "torch":
            dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
            return torch_grouped.device_problem(device_type, dtype)
        if impl == "reference":
            return None
        raise ValueError(f"unknown MoE experts implementation {impl!r}; choose one of "
                         f"{', '.join(self.implementations)}")

    def apply(self, model: torch.nn.Module, device: str, impl: str | None = None) -> dict:
        """Replace the forward of every supported experts module in ``model``.

        Args:
            model: a Hugging Face model (or any module tree) holding experts modules.
            device: where the model will run (device or device type); picks the implementation.
            impl: force ``"triton"``, ``"torch"`` or ``"reference"`` (default:
                :meth:`implementation`). A forced implementation that cannot run on ``device``
                raises ``ValueError`` with the reason.

        Returns:
            ``{"replaced": modules replaced, "impl": implementation, "skipped": {name: reason}
            for experts-like modules left alone, "fallback": {name: reason} for replaced modules
            whose shape makes every call run the reference instead (torch ``grouped_mm``'s
            16-byte rule, in the parameters' current dtype)}``.
        """
        if impl is None:
            impl = self.implementation(device)
        else:
            reason = self.why_not(impl, device)
            if reason:
                raise ValueError(f"kernel moe_groupgemm: implementation {impl!r} cannot run on {device}: {reason}")
        replaced, skipped, fallback = 0, {}, {}
        for name, module, reason in hf_experts.iter_experts(model):
            if reason is not None:
                skipped[name] = reason
                continue
            setattr(module, _IMPL_ATTR, impl)
            module.forward = types.MethodType(_grouped_forward, module)
            replaced += 1
            if impl == "torch":
                gate_up = module.gate_up_proj
                why = torch_grouped.layout_problem(gate_up.shape[2], gate_up.shape[1] // 2, gate_up.dtype)
                if why:
                    fallback[name] = why
        return {"replaced": replaced, "impl": impl, "skipped": skipped, "fallback": fallback}

    def run(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
            gate_up: torch.Tensor, down: torch.Tensor, act_fn) -> torch.Tensor:
        """The grouped experts output ``(T, H)`` for a backend that holds stacked expert weights
        itself (``gate_up`` ``(E, 2I, H)``, ``down`` ``(E, H, I)``; the arguments of
        :func:`rlweave_kernel_moe.experts.grouped_experts`), with :meth:`implementation` of
        ``hidden``'s device."""
        return experts.grouped_experts(hidden, top_k_index, top_k_weights, gate_up, down, act_fn,
                                       self.implementation(hidden.device.type))

    def remove(self, model: torch.nn.Module) -> int:
        """Give the replaced experts modules their own forward back; returns how many."""
        restored = 0
        for _, module in model.named_modules():
            if _IMPL_ATTR in module.__dict__:
                module.__dict__.pop("forward", None)
                del module.__dict__[_IMPL_ATTR]
                restored += 1
        return restored

    def __repr__(self) -> str:
        return f"<kernel {self.name}: {', '.join(self.implementations)}>"


KERNEL = MoEGroupGemm()
