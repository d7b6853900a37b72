"""Bucketing and verification (no Ray): round trip, sizes, corruption caught and named."""

from __future__ import annotations

import pytest
import torch

from rlweave.testing.workers import make_state_dict
from rlweave.weight_sync import WeightSyncError, iter_buckets, unpack_bucket
from rlweave.weight_sync.buckets import cast_floating


def test_round_trip_all_dtypes_and_bucket_sizes():
    sd = make_state_dict(0.5, seed=3)
    sd["flags"] = torch.tensor([True, False, True])
    buckets = list(iter_buckets(sd.items(), bucket_bytes=64 << 10))
    assert len(buckets) > 1
    assert [m.index for m, _ in buckets] == list(range(len(buckets)))
    for meta, payload in buckets:
        assert meta.nbytes == payload.nbytes
        assert meta.nbytes <= 64 << 10 or len(meta.names) == 1  # only a lone big tensor exceeds the size
    got = [item for m, p in buckets for item in unpack_bucket(m, p)]
    assert [n for n, _ in got] == list(sd)
    for (name, t) in got:
        assert t.dtype == sd[name].dtype and t.shape == sd[name].shape
        assert torch.equal(t, sd[name]), name


def test_corrupted_payload_is_named():
    sd = make_state_dict(0.2, seed=1)
    meta, payload = list(iter_buckets(sd.items(), bucket_bytes=1 << 30))[0]
    bad = payload.copy()
    bad[meta.offsets[1] + 5] ^= 0xFF
    with pytest.raises(WeightSyncError) as ei:
        unpack_bucket(meta, bad, "receiver")
    msg = str(ei.value)
    assert "bucket 0" in msg and "layers.0.mlp.weight" in msg and "checksum" in msg
    with pytest.raises(WeightSyncError, match="expected"):
        unpack_bucket(meta, payload[:-16])


def test_bad_bucket_size():
    with pytest.raises(ValueError):
        list(iter_buckets([], 0))


def test_cast_floating_casts_only_floating_tensors():
    items = [("w", torch.randn(3)), ("h", torch.randn(2).half()), ("n", torch.arange(4))]
    out = dict(cast_floating(iter(items), "bfloat16"))
    assert out["w"].dtype == out["h"].dtype == torch.bfloat16 and out["n"].dtype == torch.int64
    assert torch.equal(out["w"], items[0][1].to(torch.bfloat16)) and torch.equal(out["n"], items[2][1])
    assert list(cast_floating(iter(items), None)) == items
    with pytest.raises(ValueError, match="int32"):
        list(cast_floating(iter(items), "int32"))
