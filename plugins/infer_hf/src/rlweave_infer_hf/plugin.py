"""Entry point ``hf``: registers the transformers engine (light, no torch)."""

from __future__ import annotations

from rlweave.plugins import EngineRecord, hookimpl

from rlweave_infer_hf.config import HFEngineConfig


@hookimpl
def rlweave_inference_engines():
    return [
        EngineRecord(
            name="hf",
            summary="transformers generate: starts in ~1 s, for tests and tiny models",
            target="rlweave_infer_hf.engine:HFEngine",
            config_model=HFEngineConfig,
            parallel=(),
            lora=True,  # applies the policy's LoRA adapter itself (weight_sync.lora: adapter), through PEFT
            routing=True,  # records MoE routing (SamplingParams.return_routing)
            deterministic=True,  # generate samples with torch's generator seeded from SamplingParams.seed
            vision=True,  # Qwen2-VL models from VisionPrompt prompts
        )
    ]
