"""Weight sync between worker groups on 4 virtual GPUs, through the object store and over a
broadcast group (2 source ranks, 2 destination ranks): round trip with equality, a corrupted
bucket detected and named, a receiver that never answers -> WeightSyncTimeout (not a hang)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from rlweave.config.schema import RaySection, RunConfig  # noqa: E402
from rlweave.scheduler import build_roles, shutdown_ray, start_ray  # noqa: E402
from rlweave.testing.workers import PROBE, PROBE_ENGINE as ENGINE, STUCK, make_state_dict  # noqa: E402
from rlweave.weight_sync import ObjectStoreTransport, WeightSyncError, WeightSyncTimeout, sync_weights  # noqa: E402

MB, SEED, BUCKET = 4, 7, 256 << 10


@pytest.fixture(scope="module")
def roles():
    shutdown_ray()
    start_ray(RaySection(num_cpus=2, virtual_gpus=4))
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 4}}, "colocate": [["rollout", "reference", "critic"]]},
        "roles": {
            "policy": {"pool": "main", "devices": 2, "options": {"weights_mb": MB, "weights_seed": SEED}},
            "rollout": {"pool": "main", "devices": 2, "options": {"weight_dtype": "bfloat16"}},
            "reference": {"pool": "main", "devices": 1, "options": {"stuck_s": 120}},
            "critic": {"pool": "main", "devices": 1, "options": {"stuck_s": 120}},  # stuck too, for broadcast
        },
    })
    handles = build_roles(cfg, {"policy": PROBE, "rollout": ENGINE, "reference": STUCK, "critic": STUCK},
                          ["policy", "rollout", "reference", "critic"])
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
    from rlweave.weight_sync import WeightSync
    from rlweave.weight_sync.section import WeightSyncSection

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


# ------------------------------------------------------------------ broadcast transport
def test_broadcast_two_sources_to_two_destinations(roles):
    """A gloo group of the source's rank 0 and both destination ranks: bf16-cast weights
    arrive intact on every rank, again on a second sync over the same group."""
    from rlweave.weight_sync import BroadcastTransport

    transport = BroadcastTransport(timeout_s=60)
    transport.setup(roles["policy"], roles["rollout"])
    try:
        first = transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)
        second = transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)
    finally:
        transport.close()
    sent = make_state_dict(MB, SEED)
    want = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in sent.items()}
    assert first["tensors"] == second["tensors"] == len(want) and first["buckets"] >= 2
    assert first["dtype"] == "bfloat16" and first["bytes"] == second["bytes"] > 0
    for state in roles["rollout"].call("get_state").result(timeout=60):
        assert_same(state, want)
    with pytest.raises(WeightSyncError, match="setup"):  # closed: the group is gone
        transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)


def test_broadcast_corrupt_bucket_is_named_and_the_group_stays_usable(roles):
    from rlweave.testing.transports import flip_bucket_1
    from rlweave.weight_sync import BroadcastTransport

    transport = BroadcastTransport(timeout_s=60, tamper=flip_bucket_1)
    transport.setup(roles["policy"], roles["rollout"])
    try:
        with pytest.raises(WeightSyncError) as ei:
            transport.sync(roles["policy"], roles["rollout"], BUCKET, 60)
        transport.tamper = None  # receivers drained to the end marker: the same group syncs again
        ok = transport.sync(roles["policy"], roles["rollout"], BUCKET, 30)
    finally:
        transport.close()
    msg = str(ei.value)
    assert not isinstance(ei.value, WeightSyncTimeout)
    assert "'rollout' rank" in msg and "bucket 1" in msg and "checksum" in msg
    assert ok["buckets"] >= 2


def test_broadcast_stuck_receiver_times_out(roles):
    from rlweave.weight_sync import BroadcastTransport

    transport = BroadcastTransport(timeout_s=5)
    transport.setup(roles["policy"], roles["critic"])
    start = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as ei:
        transport.sync(roles["policy"], roles["critic"], BUCKET, 3)
    elapsed = time.monotonic() - start
    assert elapsed < 15, f"timeout took {elapsed:.1f} s"
    assert "'critic'" in str(ei.value) and "rank(s) 0" in str(ei.value)
    roles["critic"].shutdown(timeout_s=1)  # the stuck rank is killed, not waited for
    transport.close()
    time.sleep(5)  # the source's blocked send ends at the group timeout; the policy is free again
    assert roles["policy"].call("get_state").result(timeout=30)


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
