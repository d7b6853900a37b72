"""Token budget, weight versions and abort with vLLM's engine core in its own process (the
GPU default; the contract suite runs the CPU default, in process, through the same tests).

In subprocess mode the engine core keeps stepping while the front end reads its outputs, so
an abort must also leave no stale outputs for the next call, and a weight load pauses the
engine core between two of its steps, lands, and resumes it (tokens made before the pause
carry the old version).
"""

from __future__ import annotations

import pytest

from rlweave.testing.engine_contract import EngineContractSuite

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")

PARTIAL_TESTS = {
    "test_token_budget_stops_and_continuation_matches",
    "test_versions_stamp_every_token",
    "test_abort_from_another_thread",
    "test_weights_land_between_steps_of_a_running_call",
}


class TestVLLMSubprocessPartialRollout(EngineContractSuite):
    engine_name = "vllm"
    engine_target = "rlweave_infer_vllm.engine:VLLMEngine"
    engine_options = {"max_model_len": 48, "long_prompt": "error", "kv_cache_gib": 0.25, "dtype": "float32",
                      "engine_core": "subprocess"}
    max_model_len = 48
    long_prompt = "error"

    def test_engine_core_in_subprocess(self, engine):
        info = engine.health()
        assert info["engine_core"] == "subprocess" and info["engine_pids"]


# only the partial-rollout tests of the suite (the others run in test_vllm_contract.py)
for _name in [n for n in dir(EngineContractSuite) if n.startswith("test_") and n not in PARTIAL_TESTS]:
    setattr(TestVLLMSubprocessPartialRollout, _name, None)
