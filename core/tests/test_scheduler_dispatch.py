"""Dispatch logic of RoleHandle on an in-process worker group (no Ray): scatter by
data-parallel block, gather back in the original order, rank-0 and all-rank calls."""

from __future__ import annotations

import time

import pytest
import torch

from rlweave.data.batch import Batch
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.worker import WorkerContext
from rlweave.scheduler import LocalWorkerGroup, RoleHandle, WorkerError
from rlweave.scheduler.dispatch import dp_size
from rlweave.scheduler.future import RoleFuture, wait_any
from rlweave.testing.workers import ProbeEngine, ProbeWorker


def handle(cls, world: int, parallel=None, role="policy") -> RoleHandle:
    ctxs = [WorkerContext(role=role, rank=r, world_size=world) for r in range(world)]
    return RoleHandle(role, LocalWorkerGroup(role, cls, ctxs), parallel)


def uneven_batch(n: int = 11) -> Batch:
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, 50, (int(k),), generator=g).tolist() for k in torch.randint(2, 12, (n,), generator=g)]
    return Batch.from_sequences(seqs, ids=[f"s{i}" for i in range(n)])


def test_dp_size_rules():
    assert dp_size(4, {}) == 4
    assert dp_size(4, {"tp": 2}) == 2
    assert dp_size(4, {"dp": 1, "tp": 4}) == 1
    assert dp_size(4, {"ep": 2}) == 4 and dp_size(4, {"tp": 2, "ep": 2}) == 2  # ep splits the replicas
    with pytest.raises(ValueError):
        dp_size(4, {"dp": 3})


@pytest.mark.parametrize("world,parallel", [(1, {}), (3, {}), (4, {"tp": 2})])
def test_dp_round_trip_preserves_order(world, parallel):
    h = handle(ProbeWorker, world, parallel)
    b = uneven_batch()
    out = h.logprobs(b, temperature=2.0, with_entropy=True).result()
    torch.testing.assert_close(out["logprobs"], b.token["input_ids"].double() / 2.0)
    torch.testing.assert_close(out["entropy"], -b.token["input_ids"].double() / 2.0)
    assert len(out["rank"]) == len(b)
    if world > 1:  # several blocks really took part, and only block leaders answered
        assert set(out["rank"]) == set(range(0, world, world // h.dp))
    scores = h.scores(b).result()
    torch.testing.assert_close(scores, torch.stack([s.double().sum() for s in b.sequences()]))
    assert h.call("echo_ids", b, dispatch="dp").result() == b.ids
    back = h.call("echo_batch", batch=b, dispatch="dp").result()
    assert back.ids == b.ids and torch.equal(back.token["input_ids"], b.token["input_ids"])
    assert torch.equal(back.cu_seqlens, b.cu_seqlens)


def test_one_block_gets_the_batch_in_its_own_containers():
    h = handle(ProbeWorker, 1)
    b = uneven_batch()
    back = h.call("echo_batch", b, dispatch="dp").result()
    assert back is not b and back.ids == b.ids and torch.equal(back.token["input_ids"], b.token["input_ids"])
    back.add_token("extra", torch.zeros(b.num_tokens))
    assert "extra" not in b.token  # what a worker adds to its shard never reaches the caller's batch


def test_futures_report_where_the_controller_spent_its_time():
    h = handle(ProbeWorker, 2)
    fut = h.call("nap", 0.05)  # in-process ranks run at submission: the nap is part of dispatch
    fut.result()
    assert fut.dispatch_s >= 0.1 and fut.wait_s >= 0 and fut.combine_s >= 0
    fut = h.logprobs(uneven_batch())
    fut.result()
    assert fut.dispatch_s > 0 and fut.combine_s > 0


def test_fewer_samples_than_shards():
    h = handle(ProbeWorker, 4)
    b = uneven_batch(2)
    assert h.call("echo_ids", b, dispatch="dp").result() == b.ids
    torch.testing.assert_close(h.logprobs(b).result()["logprobs"], b.token["input_ids"].double())


def test_train_returns_rank0_metrics_and_all_sees_every_sample():
    h = handle(ProbeWorker, 3)
    b = uneven_batch(10)
    assert h.train(b, loss_fn=None).result()["rank"] == 0.0
    counts = h.call("train_step", b, None, dispatch="dp").result()["samples"]
    assert sum(counts) == 10 and len(counts) == 3


def test_generate_reassembles_prompt_order():
    h = handle(ProbeEngine, 2, role="rollout")
    prompts = [[i] * (1 + (7 * i) % 5) for i in range(9)]
    gens = h.generate(prompts, SamplingParams(n=2)).result()
    assert [g[0].token_ids[:-2] for g in gens] == [list(reversed(p)) for p in prompts]
    assert [g[1].token_ids[-2] for g in gens] == [1] * 9
    assert {g[0].token_ids[-1] for g in gens} == {0, 1}  # both replicas generated
    assert h.generate([], SamplingParams()).result() == []


def test_rank0_all_and_errors():
    h = handle(ProbeWorker, 2)
    assert [p["rank"] for p in h.call("placement").result()] == [0, 1]
    assert h.call("placement", dispatch="rank0").result()["rank"] == 0
    with pytest.raises(WorkerError) as ei:
        h.call("fail", "boom").result()
    assert ei.value.role == "policy" and ei.value.rank == 0 and "boom" in str(ei.value)
    with pytest.raises(ValueError, match="unknown dispatch"):
        h.call("placement", dispatch="scatter")
    with pytest.raises(ValueError, match="needs a Batch"):
        h.call("placement", dispatch="dp")


def test_scheduler_and_weight_sync_import_light():
    import subprocess
    import sys

    code = ("import sys, rlweave.scheduler, rlweave.weight_sync, rlweave.config.placement\n"
            "from rlweave.scheduler import RoleHandle, RoleFuture, WorkerError\n"
            "from rlweave.weight_sync import WeightTransport, WeightSyncError\n"
            "print(sorted(m for m in ('torch', 'ray', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


class _Clock(LocalWorkerGroup):
    """Calls whose pending entry is the monotonic time they are done at (a test double of the
    group contract's ``done``, for the default ``wait_any``)."""

    def __init__(self):  # noqa: D107 - no workers
        self.name, self.world_size = "clock", 1

    def done(self, pending):
        return all(time.monotonic() >= at for at in pending)


def test_default_wait_any_returns_when_a_call_is_done_or_the_time_is_up():
    group = _Clock()
    now = time.monotonic()
    calls = [(group, [now + 0.3, now + 5.0]), (group, [now + 0.4])]  # the first: one rank of two early
    wait_any([RoleFuture(g, p, list) for g, p in calls], timeout=10)
    waited = time.monotonic() - now
    assert 0.38 <= waited < 2.0, waited  # the second call, not the first call's early rank
    now = time.monotonic()
    wait_any([RoleFuture(group, [now + 5.0], list)], timeout=0.3)
    assert 0.28 <= time.monotonic() - now < 2.0
    now = time.monotonic()
    wait_any([RoleFuture(group, [now + 5.0], list), RoleFuture.ready(1)], timeout=5)
    assert time.monotonic() - now < 0.2, "a future holding its value is done"
