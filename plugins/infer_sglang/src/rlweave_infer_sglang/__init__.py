"""rlweave rollout engine on SGLang — registered, not implemented yet.

The plugin registers the engine name ``sglang`` so it shows in ``rlweave list-plugins``
(status ``unavailable``, with the reason :func:`probe` gives) and a config selecting it
fails at validation with that reason, not "unknown engine"; importing the engine module
raises :data:`NOT_IMPLEMENTED`.
"""

import importlib.util

ALTERNATIVE = "use engine 'vllm' or 'hf' instead"

NOT_INSTALLED = (
    "SGLang is not installed (it pins CUDA-only kernels such as sglang-kernel and flashinfer, and its CPU "
    "backend needs Intel AMX) and this engine is not implemented yet; " + ALTERNATIVE
)

NOT_IMPLEMENTED = (
    "the SGLang rollout engine (rlweave-infer-sglang) is not implemented yet: SGLang cannot be installed "
    "on this CPU-only setup (it pins CUDA-only kernels such as sglang-kernel and flashinfer, and its CPU "
    "backend needs Intel AMX); " + ALTERNATIVE
)


def probe() -> str:
    """Why the engine cannot run here: SGLang is missing, and the engine is not implemented
    yet either way. Light: looks for the package without importing it."""
    if importlib.util.find_spec("sglang") is None:
        return NOT_INSTALLED
    return "not implemented yet: rlweave-infer-sglang has no engine for the installed SGLang; " + ALTERNATIVE


__all__ = ["NOT_IMPLEMENTED", "NOT_INSTALLED", "probe"]
