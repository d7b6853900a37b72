"""The agent episode's own clock (``rlweave.algo_helpers.agent.clock``): it stops while a request
waits for the engine, once for requests that wait together."""

from __future__ import annotations

from rlweave.algo_helpers.agent.clock import AgentClock


def test_engine_waits_pause_the_clock_once_even_when_they_overlap():
    t = [10.0]
    clock = AgentClock(now=lambda: t[0])
    t[0] = 11.0  # 1 s of the agent's own
    first, second = clock.engine_wait(), clock.engine_wait()
    first.__enter__()
    t[0] = 13.0
    second.__enter__()  # a second request while the first waits
    t[0] = 14.0
    first.__exit__(None, None, None)
    assert clock.paused and clock.own_s() == 1.0
    t[0] = 16.0
    second.__exit__(None, None, None)
    assert not clock.paused and clock.engine_s() == 5.0
    t[0] = 16.5
    assert clock.own_s() == 1.5
    with clock.engine_wait():
        t[0] = 20.0
        assert clock.own_s() == 1.5 and clock.engine_s() == 8.5
    assert clock.own_s() == 1.5
