"""Partial rollout on the transformers engine beyond the contract suite: the shared budget
and finish rules (:mod:`rlweave.engine_helpers.requests`), the abort flag registry, and an
abort that lands between micro-batches (``max_batch_size``)."""

from __future__ import annotations

import threading
import time

import pytest

from rlweave.engine_helpers.requests import CallRegistry, finish_generation, plan_requests, response_limit
from rlweave.interfaces.engine import SamplingParams
from rlweave.testing.engine_contract import EngineContractSuite


# ------------------------------------------------------------ shared rules (no model)
def test_response_limit_is_min_of_max_new_tokens_budget_and_room():
    p = SamplingParams(max_new_tokens=10, token_budget=4)
    assert response_limit(p, room=20) == (4, True)  # the budget binds: unfinished at 4
    assert response_limit(p, room=3) == (3, False)  # the room binds: finished ("length")
    assert response_limit(SamplingParams(max_new_tokens=4, token_budget=4), room=20) == (4, False)  # a tie is "length"
    assert response_limit(SamplingParams(max_new_tokens=10), room=20) == (10, False)
    reqs = plan_requests([[1, 2], [3] * 14], SamplingParams(n=2, max_new_tokens=10, token_budget=4), max_model_len=16)
    assert [(r.max_new_tokens, r.budget_limited) for r in reqs] == [(4, True)] * 2 + [(2, False)] * 2


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_token_budget_validated(bad):
    with pytest.raises(ValueError, match=r"token_budget=.*must be None or an integer >= 1"):
        plan_requests([[1]], SamplingParams(token_budget=bad), 8)


def test_finish_reasons_and_versions():
    (budgeted,) = plan_requests([[1]], SamplingParams(max_new_tokens=10, token_budget=3), 64)
    (plain,) = plan_requests([[1]], SamplingParams(max_new_tokens=3), 64)
    stops = [9]
    g = finish_generation(budgeted, [5, 6, 7, 8], [-1.0, -2.0, -3.0, -4.0], stops, version=4)
    assert (g.token_ids, g.logprobs, g.finish_reason, g.versions) == ([5, 6, 7], [-1.0, -2.0, -3.0], "aborted", [4] * 3)
    assert finish_generation(budgeted, [5, 6, 9], [-1.0] * 3, stops, 0).finish_reason == "stop"  # stop at the budget
    assert finish_generation(plain, [5, 6, 7], [-1.0] * 3, stops, 0).finish_reason == "length"
    # stopped early by abort(): short of the limit without a stop token
    assert finish_generation(plain, [5], [-1.0], stops, 0, aborted=True).finish_reason == "aborted"
    assert finish_generation(plain, [5, 6, 7], [-1.0] * 3, stops, 0, aborted=True).finish_reason == "length"
    empty = finish_generation(plain, [], [], stops, 2, aborted=True)
    assert (empty.token_ids, empty.finish_reason, empty.versions) == ([], "aborted", [])


def test_call_registry_flags_registered_calls_only():
    calls = CallRegistry()
    assert calls.abort_all() == 0 and calls.registered == 0
    with calls.call() as first:
        assert not first.is_set()
        assert calls.abort_all() == 1 and first.is_set()
    with calls.call() as later:  # an abort before a call started does not reach it
        assert not later.is_set()
    assert calls.registered == 0


def test_call_registry_runs_calls_one_at_a_time():
    """A second call waits for the first; an abort reaches both, the waiting one included."""
    calls = CallRegistry()
    order: list[str] = []

    def second() -> None:
        with calls.call() as flag:
            order.append(f"second aborted={flag.is_set()}")

    with calls.call() as flag:
        worker = threading.Thread(target=second)
        worker.start()
        for _ in range(1000):  # until the second call has registered and waits its turn
            if calls.registered == 2:
                break
            time.sleep(0.001)
        assert calls.registered == 2 and order == []
        assert calls.abort_all() == 2 and flag.is_set()
        order.append("first done")
    worker.join(timeout=10)
    assert order == ["first done", "second aborted=True"]


# ------------------------------------------------------------ engine: micro-batches
class TestHFAbortBetweenMicroBatches(EngineContractSuite):
    """``max_batch_size: 2``: an abort ends the micro-batch running and the ones not started
    come back ``"aborted"`` with no tokens; continuing every sample gives the full output."""

    engine_name = "hf"
    engine_target = "rlweave_infer_hf.engine:HFEngine"
    engine_options = {"max_model_len": 32, "long_prompt": "error", "max_batch_size": 2}
    max_model_len = 32

    def test_abort_mid_call_then_continue(self, engine):
        prompts = [[(11 * i) % 97 + 2, (7 * i) % 89 + 2, 5] for i in range(8)]
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_model_len, ignore_eos=True)
        room = self.max_model_len - 3
        _, gens, took = self._generate_then_abort(engine, prompts, params, delay=None)
        full = [g[0] for g in gens]
        for fraction in (1 / 3, 1 / 10, 0.0):
            asked, gens, _ = self._generate_then_abort(engine, prompts, params, delay=took * fraction)
            if asked:
                break
        assert asked == 1
        out = [g[0] for g in gens]
        lengths = sorted(len(g.token_ids) for g in out)
        assert lengths[0] == 0, "micro-batches after the aborted one should not have started"
        assert sum(0 < n < room for n in lengths) <= 2, "only the micro-batch running was cut mid-way"
        for g, f in zip(out, full):
            assert g.finish_reason == ("length" if len(g.token_ids) == room else "aborted")
            assert g.token_ids == f.token_ids[: len(g.token_ids)]
        todo = [i for i, g in enumerate(out) if g.finish_reason == "aborted"]
        rest = engine.generate([prompts[i] + out[i].token_ids for i in todo], params)
        assert [out[i].token_ids + r[0].token_ids for i, r in zip(todo, rest)] == [full[i].token_ids for i in todo]


for _name in [n for n in dir(EngineContractSuite) if n.startswith("test_")]:
    setattr(TestHFAbortBetweenMicroBatches, _name, None)
