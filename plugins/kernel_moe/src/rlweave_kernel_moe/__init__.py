"""rlweave-kernel-moe: grouped MoE experts for Hugging Face MoE models (kernel ``moe_groupgemm``).

Light on import: ``plugin`` imports no torch. The heavy object is
``rlweave_kernel_moe.kernel:KERNEL``; the math lives in ``experts.grouped_experts``.
"""

__version__ = "0.1.0"
