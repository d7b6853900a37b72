"""The engine contract suite on the transformers engine, plus HF-specific checks."""

from __future__ import annotations

from rlweave.interfaces.engine import SamplingParams
from rlweave.testing.engine_contract import EngineContractSuite


class TestHFEngineContract(EngineContractSuite):
    engine_name = "hf"
    engine_target = "rlweave_infer_hf.engine:HFEngine"
    engine_options = {"max_model_len": 48, "long_prompt": "error"}
    max_model_len = 48
    long_prompt = "error"


class TestHFEngineTruncate(EngineContractSuite):
    """Only the long-prompt test, with left truncation configured."""

    engine_name = "hf"
    engine_target = "rlweave_infer_hf.engine:HFEngine"
    engine_options = {"max_model_len": 32, "long_prompt": "truncate"}
    max_model_len = 32
    long_prompt = "truncate"

    def test_truncation_keeps_prompt_tail(self, engine, reference):
        from rlweave.testing.reference import reference_greedy

        prompt = [(5 * i) % 90 + 3 for i in range(40)]
        out = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True))
        g = out[0][0]
        assert g.truncated and len(g.token_ids) == 6
        keep = 32 - min(6, 32 // 2)
        assert g.token_ids == reference_greedy(reference["model"], prompt[-keep:], 6)


# the truncating class runs only its own test and the long-prompt test
for _name in [n for n in dir(EngineContractSuite) if n.startswith("test_") and n != "test_long_prompt_handled_and_engine_survives"]:
    setattr(TestHFEngineTruncate, _name, None)
