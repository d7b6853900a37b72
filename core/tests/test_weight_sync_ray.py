"""Weight sync through the object store between worker groups on 4 virtual GPUs:
round trip with equality, a corrupted bucket detected and named, a receiver that never
answers -> WeightSyncTimeout (not a hang)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from rlweave.config.schema import RaySection, RunConfig  # noqa: E402
from rlweave.plugins.types import BackendRecord, EngineRecord  # noqa: E402
from rlweave.scheduler import build_roles, shutdown_ray, start_ray  # noqa: E402
from rlweave.testing.workers import make_state_dict  # noqa: E402
from rlweave.weight_sync import ObjectStoreTransport, WeightSyncError, WeightSyncTimeout, sync_weights  # noqa: E402

PROBE = BackendRecord(name="probe", summary="test worker", target="rlweave.testing.workers:ProbeWorker")
STUCK = BackendRecord(name="stuck", summary="never loads", target="rlweave.testing.workers:StuckReceiver")
ENGINE = EngineRecord(name="probe-engine", summary="test engine", target="rlweave.testing.workers:ProbeEngine")
MB, SEED, BUCKET = 4, 7, 256 << 10


@pytest.fixture(scope="module")
def roles():
    shutdown_ray()
    start_ray(RaySection(num_cpus=2, virtual_gpus=4))
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 4}}, "colocate": [["rollout", "reference"]]},
        "roles": {
            "policy": {"pool": "main", "devices": 2, "options": {"weights_mb": MB, "weights_seed": SEED}},
            "rollout": {"pool": "main", "devices": 2, "options": {"weight_dtype": "bfloat16"}},
            "reference": {"pool": "main", "devices": 1, "options": {"stuck_s": 120}},
        },
    })
    handles = build_roles(cfg, {"policy": PROBE, "rollout": ENGINE, "reference": STUCK},
                          ["policy", "rollout", "reference"])
    yield handles
    for h in handles.values():
        h.shutdown()
    shutdown_ray()


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


def test_round_trip_between_groups(roles):
    """The engine asks for bf16 weights: floating tensors travel cast (fp32/fp16 -> bf16),
    integer ones as they are, and every rank receives exactly the cast tensors."""
    stats = sync_weights(roles["policy"], roles["rollout"], bucket_bytes=BUCKET, timeout_s=60)
    sent = make_state_dict(MB, SEED)
    want = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in sent.items()}
    total = sum(t.numel() * t.element_size() for t in want.values())
    assert total >= 1 << 20 and total < 0.8 * sum(t.numel() * t.element_size() for t in sent.values())
    assert total <= stats["bytes"] <= total + 16 * len(want)  # payload plus alignment padding
    assert stats["tensors"] == len(want) and stats["buckets"] >= 2 and stats["dtype"] == "bfloat16"
    assert stats["seconds"] > 0 and stats["bytes_per_s"] > 0
    for state in roles["rollout"].call("get_state").result(timeout=60):  # every rank got everything
        assert_same(state, want)


def test_run_weight_sync_reuses_one_transport_per_pair(roles):
    """The runner's WeightSync: bucket size from the config section, one transport per
    (source, destination) pair set up once, and every sync lands in every rank."""
    from rlweave.config.schema import WeightSyncSection
    from rlweave.weight_sync import WeightSync

    ws = WeightSync(roles, WeightSyncSection(bucket_mb=0.25, timeout_s=60))
    try:
        first = ws.sync("policy", "rollout")
        transport = ws.transport("policy", "rollout")
        second = ws.sync("policy", "rollout")
        assert ws.transport("policy", "rollout") is transport and transport.name == "object_store"
        assert first["buckets"] == second["buckets"] and first["buckets"] >= 4  # 0.25 MiB buckets of 4 MB
    finally:
        ws.close()
    sent = make_state_dict(MB, SEED)
    want = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in sent.items()}
    for state in roles["rollout"].call("get_state").result(timeout=60):
        assert_same(state, want)


def test_corrupted_bucket_is_detected_and_named(roles):
    transport = ObjectStoreTransport()
    sent = transport.send(roles["policy"], bucket_bytes=BUCKET, timeout_s=60)
    meta, ref = sent[1]
    payload = ray.get(ref).copy()
    payload[len(payload) // 2] ^= 0x01
    sent[1] = (meta, ray.put(payload))
    with pytest.raises(WeightSyncError) as ei:
        transport.receive(roles["rollout"], sent, timeout_s=60)
    msg = str(ei.value)
    assert not isinstance(ei.value, WeightSyncTimeout)
    assert "'rollout' rank" in msg and "bucket 1" in msg and "checksum" in msg
    assert all(name in msg for name in meta.names)


def test_receiver_that_never_answers_times_out(roles):
    start = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as ei:
        sync_weights(roles["policy"], roles["reference"], bucket_bytes=BUCKET, timeout_s=3)
    elapsed = time.monotonic() - start
    assert elapsed < 15, f"timeout took {elapsed:.1f} s"
    msg = str(ei.value)
    assert "'reference'" in msg and "rank(s) 0" in msg and "3 s" in msg
    roles["reference"].shutdown(timeout_s=1)  # the stuck rank is killed, not waited for
    assert time.monotonic() - start < 25
