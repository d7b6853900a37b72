"""The engine contract suite on the transformers engine on a CUDA device (skipped without one):
generation, log-probs against transformers, weight loads, and the partial-rollout contract
(token budget, continuation, weight versions, abort from another thread) on the GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlweave.testing.engine_contract import EngineContractSuite

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class TestHFEngineContractCuda(EngineContractSuite):
    engine_name = "hf"
    engine_target = "rlweave_infer_hf.engine:HFEngine"
    engine_options = {"max_model_len": 48, "long_prompt": "error"}
    max_model_len = 48
    long_prompt = "error"

    def make_context(self, model_dir, rank=0):
        return replace(super().make_context(model_dir, rank), device="cuda")

    # the scheduler test starts the engine through Ray, which this check does not need
    test_dead_engine_reported_with_role_and_rank = None
