"""rlweave rollout engine on SGLang — registered, not implemented yet.

The plugin registers the engine name ``sglang`` so it shows in ``rlweave list-plugins``
and a config selecting it fails at validation with the reason, not "unknown engine".
"""

NOT_IMPLEMENTED = (
    "the SGLang rollout engine (rlweave-infer-sglang) is not implemented yet: SGLang cannot be installed "
    "on this CPU-only setup (it pins CUDA-only kernels such as sglang-kernel and flashinfer, and its CPU "
    "backend needs Intel AMX); use engine 'vllm' or 'hf' instead"
)

__all__ = ["NOT_IMPLEMENTED"]
