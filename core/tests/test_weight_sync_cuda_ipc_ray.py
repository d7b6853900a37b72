"""The cuda_ipc transport between Ray worker groups on one node (CPU shared memory, virtual
GPUs): 1 source rank -> 2 destination ranks with a bf16 cast, a corrupt bucket named, a stuck
receiver -> WeightSyncTimeout, and ``transport: auto`` resolving to the object store on CPU."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from rlweave.config.schema import RaySection, RunConfig  # noqa: E402
from rlweave.scheduler import build_roles, shutdown_ray, start_ray  # noqa: E402
from rlweave.testing.workers import PROBE, PROBE_ENGINE as ENGINE, STUCK, make_state_dict  # noqa: E402
from rlweave.weight_sync import CudaIpcTransport, WeightSync, WeightSyncError, WeightSyncTimeout  # noqa: E402
from rlweave.weight_sync.section import WeightSyncSection  # noqa: E402

MB, SEED, BUCKET = 4, 11, 256 << 10


@pytest.fixture(scope="module")
def roles():
    shutdown_ray()
    start_ray(RaySection(num_cpus=2, virtual_gpus=4))
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 4}}, "colocate": [["policy", "rollout"]]},
        "roles": {
            "policy": {"pool": "main", "devices": 1, "options": {"weights_mb": MB, "weights_seed": SEED}},
            "rollout": {"pool": "main", "devices": 2, "options": {"weight_dtype": "bfloat16"}},
            "critic": {"pool": "main", "devices": 1, "options": {"stuck_s": 120}},
        },
    })
    handles = build_roles(cfg, {"policy": PROBE, "rollout": ENGINE, "critic": STUCK}, ["policy", "rollout", "critic"])
    yield handles
    for h in handles.values():
        h.shutdown()
    shutdown_ray()


def want_bf16() -> dict:
    sent = make_state_dict(MB, SEED)
    return {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in sent.items()}


def assert_loaded(handle, want: dict) -> None:
    for state in handle.call("get_state").result(timeout=60):  # every rank got everything
        assert list(state) == list(want)
        for name, t in want.items():
            assert state[name].dtype == t.dtype and torch.equal(state[name], t), name


def test_one_source_two_destinations_with_a_bf16_cast(roles):
    transport = CudaIpcTransport(timeout_s=60)
    transport.setup(roles["policy"], roles["rollout"])
    try:
        first = transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)
        second = transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)
    finally:
        transport.close()
    want = want_bf16()
    assert first["tensors"] == second["tensors"] == len(want) and first["buckets"] >= 4
    assert first["dtype"] == "bfloat16" and first["bytes"] == second["bytes"] > 0
    assert_loaded(roles["rollout"], want)
    with pytest.raises(WeightSyncError, match="setup"):  # closed: the channel is gone
        transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)


def test_corrupt_bucket_is_named_and_the_channel_stays_usable(roles):
    from rlweave.testing.transports import flip_shared_bucket_1

    transport = CudaIpcTransport(timeout_s=60, tamper=flip_shared_bucket_1)
    transport.setup(roles["policy"], roles["rollout"])
    try:
        with pytest.raises(WeightSyncError) as ei:
            transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)
        transport.tamper = None  # receivers acknowledged to the end: the same channel syncs again
        ok = transport.sync(roles["policy"], roles["rollout"], BUCKET, 30)
    finally:
        transport.close()
    msg = str(ei.value)
    assert not isinstance(ei.value, WeightSyncTimeout)
    assert "'rollout' rank" in msg and "(cuda_ipc)" in msg and "bucket 1" in msg and "checksum" in msg
    assert ok["buckets"] >= 4
    assert_loaded(roles["rollout"], want_bf16())


def test_auto_is_the_object_store_on_cpu_and_cuda_ipc_can_be_configured(roles):
    auto = WeightSync(roles, WeightSyncSection(bucket_mb=0.25, timeout_s=60))
    ipc = WeightSync(roles, WeightSyncSection(transport="cuda_ipc", bucket_mb=0.25, timeout_s=60))
    try:
        assert auto.transport("policy", "rollout").name == "object_store"
        stats = ipc.sync("policy", "rollout")
        assert ipc.transport("policy", "rollout").name == "cuda_ipc" and stats["buckets"] >= 4
    finally:
        auto.close()
        ipc.close()
    assert_loaded(roles["rollout"], want_bf16())


def test_stuck_receiver_times_out(roles):
    transport = CudaIpcTransport(timeout_s=5)
    transport.setup(roles["policy"], roles["critic"])
    start = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as ei:
        transport.sync(roles["policy"], roles["critic"], BUCKET, 3)
    elapsed = time.monotonic() - start
    assert elapsed < 15, f"timeout took {elapsed:.1f} s"
    assert "'critic'" in str(ei.value) and "rank(s) 0" in str(ei.value)
    roles["critic"].shutdown(timeout_s=1)  # the stuck rank is killed, not waited for
    transport.close()
    time.sleep(5)  # the source's wait for acknowledgements ends at the channel timeout; it is free again
    assert roles["policy"].call("get_state").result(timeout=30)
