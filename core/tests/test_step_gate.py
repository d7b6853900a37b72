"""StepGate: a weight update never overlaps a decoding step, lands at the next boundary of a
running call (before the call goes on), goes first when it waits, and is reentrant."""

from __future__ import annotations

import threading
import time

from rlweave.interfaces.step_gate import StepGate


def _call(gate: StepGate, steps: int, step_s: float, log: list, stepping: threading.Event) -> None:
    with gate.running():
        for i in range(steps):
            stepping.set()
            log.append(("step", i))
            time.sleep(step_s)
            log.append(("end", i))
            gate.boundary()


def test_an_update_lands_between_two_steps_of_a_running_call():
    gate, log, stepping = StepGate(), [], threading.Event()
    t = threading.Thread(target=_call, args=(gate, 40, 0.005, log, stepping))
    t.start()
    stepping.wait(5)
    with gate.update():
        log.append(("update", None))
        assert gate.busy  # the call is parked, not ended
        with gate.update():  # reentrant on this thread
            log.append(("nested", None))
    t.join(10)
    kinds = [k for k, _ in log]
    at = kinds.index("update")
    assert 0 < at < len(kinds) - 2 and kinds[at - 1] == "end" and kinds[at + 2] == "step", kinds
    assert kinds.count("step") == kinds.count("end") == 40
    assert gate.updates == 1 and gate.landed_in_call == 1 and not gate.busy


def test_a_waiting_update_goes_before_a_new_call_and_without_a_call_runs_at_once():
    gate = StepGate()
    with gate.update():
        pass
    assert gate.updates == 1 and gate.landed_in_call == 0
    order: list[str] = []
    release = threading.Event()

    def hold_update():
        with gate.update():
            order.append("update")
            release.wait(5)

    holder = threading.Thread(target=hold_update)
    holder.start()
    while not order:
        time.sleep(0.001)
    caller = threading.Thread(target=lambda: (gate.running().__enter__(), order.append("call")))
    caller.start()
    time.sleep(0.05)
    assert order == ["update"], "a call started while an update ran"
    release.set()
    holder.join(5)
    caller.join(5)
    assert order == ["update", "call"]


def test_a_call_that_never_offers_a_boundary_makes_the_update_wait_for_its_end():
    gate, ended = StepGate(), threading.Event()

    def call():
        with gate.running():
            time.sleep(0.1)
        ended.set()

    t = threading.Thread(target=call)
    t.start()
    while not gate.busy:
        time.sleep(0.001)
    with gate.update():
        assert not gate.busy
    t.join(5)
    assert gate.landed_in_call == 0


def test_update_waiting_is_true_from_a_waiting_update_until_it_is_done():
    gate = StepGate()
    assert not gate.update_waiting
    entered, release = threading.Event(), threading.Event()

    def update() -> None:
        with gate.update():
            entered.set()
            release.wait(10)

    with gate.running():
        t = threading.Thread(target=update)
        t.start()
        for _ in range(1000):  # the update waits for the running call's boundary
            if gate.update_waiting:
                break
            time.sleep(0.001)
        assert gate.update_waiting and not entered.is_set()
        parked = threading.Thread(target=gate.boundary)
        parked.start()
        assert entered.wait(10) and gate.update_waiting  # it runs while the call is parked
        release.set()
        parked.join(10)
        t.join(10)
    assert not gate.update_waiting and gate.updates == 1
