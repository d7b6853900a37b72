"""The in-process weight transport between roles whose workers run in this process: a round
trip in the destination's dtype, a corrupt bucket named, a sync that ran past its timeout
reported, and what ``transport: auto`` picks for such roles."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from rlweave.interfaces.worker import WorkerContext  # noqa: E402
from rlweave.scheduler.contexts import init_method  # noqa: E402
from rlweave.scheduler.handle import RoleHandle  # noqa: E402
from rlweave.scheduler.local import LocalWorkerGroup  # noqa: E402
from rlweave.testing.transports import flip_bucket_1  # noqa: E402
from rlweave.testing.workers import ProbeEngine, ProbeWorker, make_state_dict  # noqa: E402
from rlweave.weight_sync import WeightSync, WeightSyncError, WeightSyncTimeout  # noqa: E402
from rlweave.weight_sync.in_process import InProcessTransport  # noqa: E402


def roles(engine_options: dict | None = None, receiver=ProbeEngine) -> tuple[RoleHandle, RoleHandle]:
    policy = RoleHandle("policy", LocalWorkerGroup("policy", ProbeWorker, [
        WorkerContext(role="policy", options={"weights_mb": 0.5, "weights_seed": 3})]))
    rollout = RoleHandle("rollout", LocalWorkerGroup("rollout", receiver, [
        WorkerContext(role="rollout", options=engine_options or {})]))
    policy.call("init_model").result()
    rollout.call(init_method(None, receiver)).result()
    return policy, rollout


def test_round_trip_in_the_destination_dtype():
    policy, rollout = roles({"weight_dtype": "bfloat16"})
    stats = InProcessTransport().sync(policy, rollout, bucket_bytes=64 << 10, timeout_s=30)
    want = make_state_dict(0.5, 3)
    got = rollout.group.workers[0].get_state()
    assert set(got) == set(want) and stats["buckets"] > 1 and stats["dtype"] == "bfloat16"
    for name, t in want.items():
        expect = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name].dtype == expect.dtype and torch.equal(got[name], expect), name
    assert stats["bytes"] >= sum(t.numel() * t.element_size() for t in got.values())  # payloads, 16-byte aligned


def test_corrupt_bucket_is_named_and_nothing_of_it_is_loaded():
    policy, rollout = roles()
    with pytest.raises(WeightSyncError, match=r"rollout.* rank 0: .*bucket 1 .*failed verification"):
        InProcessTransport(tamper=flip_bucket_1).sync(policy, rollout, bucket_bytes=64 << 10, timeout_s=30)
    assert rollout.group.workers[0].get_state() == {}  # its load_weights never completed


class SlowReceiver(ProbeWorker):
    def load_weights(self, named_tensors):
        time.sleep(0.3)
        super().load_weights(named_tensors)


def test_a_sync_past_its_timeout_is_reported_when_it_ends():
    policy, rollout = roles(receiver=SlowReceiver)
    with pytest.raises(WeightSyncTimeout, match=r"'policy' -> 'rollout' took .* more than its 0.1 s timeout"):
        InProcessTransport().sync(policy, rollout, bucket_bytes=1 << 20, timeout_s=0.1)


def test_auto_picks_it_for_roles_in_this_process():
    policy, rollout = roles()
    ws = WeightSync({"policy": policy, "rollout": rollout})
    stats = ws.sync("policy", "rollout")
    assert type(ws.transport("policy", "rollout")) is InProcessTransport and stats["tensors"] == 6
    ws.close()
