"""Entry point module (light): registers the ``sglang`` inference engine record."""

from __future__ import annotations

from rlweave.plugins import EngineRecord, hookimpl

from rlweave_infer_sglang import probe
from rlweave_infer_sglang.config import SGLangConfig


@hookimpl
def rlweave_inference_engines() -> list[EngineRecord]:
    return [EngineRecord(
        name="sglang",
        summary="SGLang rollout engine",
        target="rlweave_infer_sglang.engine:SGLangEngine",
        config_model=SGLangConfig,
        parallel=("tp",),
        probe=probe,
    )]
