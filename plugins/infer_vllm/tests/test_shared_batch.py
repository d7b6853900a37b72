"""SharedBatch's hand-over logic on a scripted stand-in for vLLM's ``LLMEngine`` (each request
emits one token per step until its ``max_tokens``); the real engine is exercised by
``test_vllm_contract.py`` (concurrent calls, hand-over, abort)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from rlweave_infer_vllm.shared_batch import EngineCall, SharedBatch


class ScriptedEngine:
    """Requests of ``max_tokens`` tokens, one per step; ``fail_at`` makes that step raise."""

    def __init__(self, step_s: float = 0.002, fail_at: int | None = None):
        self.running: dict[str, list[int]] = {}
        self.limits: dict[str, int] = {}
        self.aborted: list[str] = []
        self.steps, self.step_s, self.fail_at = 0, step_s, fail_at
        self.stepping_threads: set[str] = set()

    def add_request(self, rid, inp, sp, lora_request=None):
        self.running[rid], self.limits[rid] = [], sp.max_tokens

    def abort_request(self, rids):
        for rid in rids:
            self.running.pop(rid, None)
            self.aborted.append(rid)

    def has_unfinished_requests(self):
        return bool(self.running)

    def step(self):
        self.steps += 1
        self.stepping_threads.add(threading.current_thread().name)
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError("engine step failed")
        time.sleep(self.step_s)
        outs = []
        for rid, toks in list(self.running.items()):
            toks.append(len(toks))
            done = len(toks) >= self.limits[rid]
            outs.append(SimpleNamespace(request_id=rid, finished=done,
                                        outputs=[SimpleNamespace(index=0, token_ids=list(toks))]))
            if done:
                del self.running[rid]
        return outs


def _call(name: str, tokens: int) -> EngineCall:
    return EngineCall([(name, None, SimpleNamespace(n=1, max_tokens=tokens))], threading.Event())


def _run_all(batch, engine, calls, gap_s=0.01):
    errors: dict[int, BaseException] = {}

    def run(i, c):
        try:
            batch.run(c, engine, version=lambda: 0, before_add=lambda e: None, boundary=None)
        except BaseException as exc:  # noqa: BLE001 - collected for the test
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
        time.sleep(gap_s)
    return threads, errors


def test_calls_share_one_stepping_thread_and_each_gets_its_tokens():
    engine, batch = ScriptedEngine(step_s=0.005), SharedBatch()
    calls = [_call("short", 10), _call("long", 30), _call("mid", 10)]
    threads, errors = _run_all(batch, engine, calls, gap_s=0.004)
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    for c, n in zip(calls, (10, 30, 10)):
        assert list(c.latest[(c.requests[0][0], 0)].token_ids) == list(range(n))
        assert not c.aborted and not c.pending
    # the long call took over the stepping when the short one (the first driver) returned
    assert len(engine.stepping_threads) >= 2, engine.stepping_threads
    assert engine.steps < 10 + 30 + 10, "the calls' requests were not batched together"


def test_a_stop_flag_aborts_only_that_calls_requests():
    engine, batch = ScriptedEngine(step_s=0.005), SharedBatch()
    calls = [_call("a", 200), _call("b", 200)]
    threads, errors = _run_all(batch, engine, calls, gap_s=0.05)
    calls[1].stop_flag.set()
    batch.wake_all()
    threads[1].join(timeout=10)
    assert not threads[1].is_alive() and calls[1].aborted and engine.aborted == ["b"]
    assert threads[0].is_alive(), "the other call ended with it"
    calls[0].stop_flag.set()
    threads[0].join(timeout=10)
    assert calls[0].aborted and not errors


def test_a_failed_step_fails_every_call_in_the_batch():
    engine, batch = ScriptedEngine(fail_at=8), SharedBatch()
    calls = [_call("a", 50), _call("b", 50)]
    threads, errors = _run_all(batch, engine, calls)
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(errors) == [0, 1] and all("engine step failed" in str(e) for e in errors.values())
    assert sorted(engine.aborted) == ["a", "b"]


def test_drain_hands_out_outputs_before_a_pause_without_adding_requests():
    """What the driver does at a paused boundary (engine core in a subprocess): ``drain``
    steps only while outputs are ready, stamps them with the version before the update, and
    adds no request of a call that joined meanwhile; the steps after it carry the new one."""
    engine, batch = ScriptedEngine(step_s=0.002), SharedBatch()
    first, joined = _call("first", 8), _call("joined", 3)
    state = {"version": 0, "drained": False}

    later = threading.Thread(target=batch.run, args=(joined, engine),
                             kwargs={"version": lambda: state["version"], "before_add": lambda e: None, "boundary": None})

    def boundary() -> None:
        if state["drained"] or engine.steps < 2 or not batch.drives(first):
            return
        later.start()  # a call joins while the engine is paused: registered, not added by the drain
        while joined not in batch._live:
            time.sleep(0.001)
        batch.drain(engine, lambda: state["version"], ready=lambda: engine.steps < 4)
        state.update(drained=True, version=1, added_in_drain=joined.added)

    batch.run(first, engine, version=lambda: state["version"], before_add=lambda e: None, boundary=boundary)
    later.join(timeout=30)
    assert state["drained"] and state["added_in_drain"] is False and not later.is_alive()
    assert first.stamps[("first", 0)] == [0, 0, 0, 0, 1, 1, 1, 1]  # steps 1-2, then 3-4 drained, then the update
    assert joined.stamps[("joined", 0)] == [1, 1, 1]  # added at the next real step, after the update


def test_drain_takes_queued_outputs_of_no_running_call():
    """Outputs still queued for requests no call waits for (an aborted call's last step) are
    taken by a drain and dropped, so a drain always ends once the queue is empty."""
    engine, batch = ScriptedEngine(step_s=0.0), SharedBatch()
    engine.add_request("orphan", None, SimpleNamespace(max_tokens=5))
    batch.drain(engine, lambda: 0, ready=lambda: engine.steps < 2)
    assert engine.steps == 2 and engine.running["orphan"] == [0, 1]
