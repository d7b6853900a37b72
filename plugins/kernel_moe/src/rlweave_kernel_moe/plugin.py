"""Entry point ``moe_groupgemm`` of rlweave-kernel-moe (light: no torch import)."""

from __future__ import annotations

import importlib.util

from rlweave.plugins import KernelRecord, hookimpl


def probe() -> str | None:
    """``None`` when the kernel can run here, else why not.

    The reference and torch paths need only torch, so the kernel is usable wherever torch is
    installed; which implementation runs on a device is ``KERNEL.implementation(device)``
    (torch ``grouped_mm`` where it works on the device, else Triton on CUDA sm80+ with triton
    installed, else the per-expert reference). Light: looks the package up, imports nothing.
    """
    if importlib.util.find_spec("torch") is None:
        return "needs torch (pip install torch)"
    return None


@hookimpl
def rlweave_kernels():
    return [
        KernelRecord(
            name="moe_groupgemm",
            summary="Grouped MoE experts for HF Qwen2-MoE/Qwen3-MoE/Mixtral: torch grouped_mm, own Triton kernels, "
                    "per-expert reference",
            target="rlweave_kernel_moe.kernel:KERNEL",
            probe=probe,
        )
    ]
