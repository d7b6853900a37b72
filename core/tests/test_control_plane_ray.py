"""The rollout ranks' control channel on Ray: a weight sync begun while the engine generates
neither waits for the generate call nor is queued behind it; its weights land between two
decoding steps (tokens carry both versions); the dtype is asked once per transport; abort()
reaches a running call; an engine that serves concurrent calls gets them at once; a call on the
control channel that computed leaves no OpenMP worker threads behind. Engine: the
probe engine (decoding steps of 30 ms with boundaries), source: the probe worker; one Ray
cluster for the module."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from rlweave.config.schema import RaySection, RunConfig  # noqa: E402
from rlweave.interfaces.engine import SamplingParams  # noqa: E402
from rlweave.scheduler import build_roles, shutdown_ray, start_ray  # noqa: E402
from rlweave.testing.workers import (  # noqa: E402
    CONCURRENT_PROBE_ENGINE,
    PROBE,
    PROBE_ENGINE,
    engine_busy,
    process_threads,
    process_threads_around_compute,
)
from rlweave.weight_sync import ObjectStoreTransport  # noqa: E402
from rlweave.weight_sync.section import WeightSyncSection  # noqa: E402
from rlweave.weight_sync.service import WeightSync  # noqa: E402

STEP_S, STEPS = 0.03, 150  # a generate call of ~4.5 s


@pytest.fixture(scope="module")
def roles():
    shutdown_ray()
    start_ray(RaySection(num_cpus=2, virtual_gpus=3))  # the third: test_concurrent_calls_share_the_rank
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 2}}},
        "roles": {
            "policy": {"pool": "main", "devices": 1, "options": {"weights_mb": 1, "weights_seed": 3}},
            "rollout": {"pool": "main", "devices": 1, "options": {"step_s": STEP_S, "weight_dtype": "bfloat16"}},
        },
    })
    handles = build_roles(cfg, {"policy": PROBE, "rollout": PROBE_ENGINE}, ["policy", "rollout"])
    yield handles
    for h in handles.values():
        h.shutdown()
    shutdown_ray()


def _wait_running(rollout, call) -> None:
    """Until the engine's generate runs (asked on the control channel, which is not queued)."""
    deadline = time.monotonic() + 60
    while not rollout.submit_ranks("engine_busy", [0], [((), {})], lambda v: v[0], fn=engine_busy,
                                   control=True).result(timeout=30):
        assert not call.done() and time.monotonic() < deadline, "generate never started"
        time.sleep(0.01)


def test_sync_begun_during_generate_lands_between_steps(roles):
    policy, rollout = roles["policy"], roles["rollout"]
    params = SamplingParams(n=1, max_new_tokens=STEPS)
    call = rollout.generate([[1, 2]], params)
    queued = rollout.generate([[3]], SamplingParams(n=1, max_new_tokens=5))  # a second call waits its turn
    _wait_running(rollout, call)
    transport = ObjectStoreTransport()
    t0 = time.monotonic()
    finish = transport.begin(policy, rollout, 256 << 10, timeout_s=60, version=5)
    begun_s = time.monotonic() - t0
    stats = finish()
    landed_s = time.monotonic() - t0
    assert not call.done(), "the sync waited for the generate call"
    assert begun_s < STEP_S * STEPS / 3 and landed_s < STEP_S * STEPS / 2, (begun_s, landed_s)
    (gen,) = call.result(timeout=60)[0]
    assert len(gen.versions) == STEPS and gen.finish_reason == "length"
    assert gen.versions == sorted(gen.versions) and set(gen.versions) == {0, 5}, "both versions, in order"
    assert queued.result(timeout=60)[0][0].versions == [5] * 5
    assert stats["dtype"] == "bfloat16" and stats["tensors"] > 0
    (state,) = rollout.call("get_state").result(timeout=30)
    assert state and all(t.dtype == torch.bfloat16 for t in state.values() if t.is_floating_point())


def test_dtype_asked_once_and_blocking_sync_stamps_version(roles):
    policy, rollout = roles["policy"], roles["rollout"]
    transport = ObjectStoreTransport()
    calls = []
    real = rollout.submit_ranks

    def counting(method, *args, **kwargs):
        calls.append((method, kwargs.get("control", False)))
        return real(method, *args, **kwargs)

    rollout.submit_ranks = counting
    try:
        for version in (7, 8):
            transport.sync(policy, rollout, 256 << 10, timeout_s=60, version=version)
    finally:
        del rollout.submit_ranks
    assert calls == [("weight_dtype", True), ("receive_weights", True), ("receive_weights", True)]
    got = rollout.generate([[4]], SamplingParams(n=1, max_new_tokens=2)).result(timeout=60)
    assert got[0][0].versions == [8, 8]


@pytest.mark.parametrize("transport", ["auto", "broadcast"])
def test_weight_sync_start_does_not_block_and_abort_reaches_the_call(roles, transport):
    """Through the run's ``WeightSync`` (auto picks the object store here, broadcast runs its
    two ends over a gloo group): ``start`` returns and its sync finishes while the call runs."""
    rollout = roles["rollout"]
    ws = WeightSync(roles, WeightSyncSection(transport=transport))
    ws.sync("policy", "rollout", version=10)  # the pair's transport is made and set up
    call = rollout.generate([[1]], SamplingParams(n=1, max_new_tokens=STEPS))
    _wait_running(rollout, call)
    pending = ws.start("policy", "rollout", version=11)
    pending.result()
    assert not call.done()
    assert rollout.abort().result(timeout=30) == 1
    (gen,) = call.result(timeout=30)[0]
    assert gen.finish_reason == "aborted" and 0 < len(gen.versions) < STEPS and gen.versions[-1] == 11
    assert ws.transport("policy", "rollout").name == ("object_store" if transport == "auto" else transport)
    ws.close()


def test_concurrent_calls_share_the_rank(roles):  # roles: the module's cluster, with a device to spare
    """An engine class with ``concurrent_calls`` 2: a short call sent after a long one runs
    beside it and returns first (the probe engine above, with 1, makes it wait its turn)."""
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"spare": {"devices_per_node": 1}}},
        "roles": {"rollout": {"pool": "spare", "devices": 1, "options": {"step_s": STEP_S}}},
    })
    rollout = build_roles(cfg, {"rollout": CONCURRENT_PROBE_ENGINE}, ["rollout"])["rollout"]
    try:
        assert rollout.concurrent_calls == 2
        long = rollout.generate([[1]], SamplingParams(n=1, max_new_tokens=STEPS))
        _wait_running(rollout, long)
        short = rollout.generate([[2]], SamplingParams(n=1, max_new_tokens=5))
        assert len(short.result(timeout=60)[0][0].versions) == 5
        assert not long.done(), "the short call waited for the long one"
        assert rollout.abort().result(timeout=30) >= 1
        assert long.result(timeout=30)[0][0].finish_reason == "aborted"
    finally:
        rollout.shutdown()


def test_control_calls_leave_no_openmp_workers_behind(roles):
    """The control channel's threads live as long as the rank; a pool of OpenMP workers kept by
    each would slow every parallel region of the process (rlweave.devices.openmp)."""
    rollout = roles["rollout"]

    def on_control(fn):
        return rollout.submit_ranks(fn.__name__, [0], [((), {})], lambda v: v[0], fn=fn, control=True).result(30)

    before, during, threads = on_control(process_threads_around_compute)
    if threads < 2:
        pytest.skip("the rank runs one intra-op thread here: no OpenMP pool to leave")
    assert during == before + threads - 1, "the call's parallel op started a pool of workers"
    assert on_control(process_threads) == before, "the pool outlived the call"
