"""Ranks that span several devices, on 4 virtual GPUs: a rollout role with ``devices: 4`` and
``parallel: {tp: 2}`` whose engine record says a rank spans ``tp`` (as vLLM's does) gets two
ranks, each a replica whose process sees its two devices; the replicas' devices are disjoint
and cover the role's four, also when the role shares them with a colocated trainer. Generation
is dispatched over the two replicas, weight sync reaches both, sleep/wake addresses both.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from rlweave.config.schema import RunConfig  # noqa: E402
from rlweave.interfaces.engine import SamplingParams  # noqa: E402
from rlweave.plugins.types import BackendRecord, EngineRecord  # noqa: E402
from rlweave.scheduler import build_roles  # noqa: E402
from rlweave.weight_sync import BroadcastTransport, sync_weights  # noqa: E402

PROBE = BackendRecord(name="probe", summary="test worker", target="rlweave.testing.workers:ProbeWorker")
SPANNING = EngineRecord(name="probe-tp", summary="test engine, one rank per tp devices",
                        target="rlweave.testing.workers:ProbeEngine", parallel=("dp", "tp"), rank_spans=("tp",))


def run_config(roles: dict, colocate=None) -> RunConfig:
    return RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 4}}, "colocate": colocate or []},
        "roles": {name: {"pool": "main", **spec} for name, spec in roles.items()},
    })


def placements(handle) -> list[dict]:
    return handle.submit_ranks("placement", list(range(handle.world_size)), [((), {})] * handle.world_size, list,
                               on_actor=True).result(timeout=60)


def visible(p: dict) -> list[str]:
    return (p["cuda_visible_devices"] or "").split(",") if p["cuda_visible_devices"] else []


def _ctx_of(worker, rank):
    return {"rank": worker.ctx.rank, "world_size": worker.ctx.world_size, "parallel": dict(worker.ctx.parallel)}


def assert_replicas_own_two_devices_each(rollout) -> list[list[str]]:
    assert rollout.world_size == 2 and rollout.dp == 2
    seen = placements(rollout)
    ids = [visible(p) for p in seen]
    for p, mine in zip(seen, ids):
        assert len(mine) == 2 and len(set(mine)) == 2, seen  # tp device ids, distinct
        assert set(p["gpu_ids"]) <= set(mine), seen  # Ray's own bundle is one of them
    assert not set(ids[0]) & set(ids[1]), seen
    assert set(ids[0]) | set(ids[1]) == {"0", "1", "2", "3"}, seen
    assert len({p["pid"] for p in seen}) == 2
    ctxs = rollout.submit_ranks("ctx", [0, 1], [((), {})] * 2, list, fn=_ctx_of).result(timeout=60)
    assert ctxs == [{"rank": r, "world_size": 2, "parallel": {"tp": 2}} for r in (0, 1)]
    return ids


def test_a_lone_replica_role_sees_tp_devices_per_rank_also_when_rebuilt(cluster):
    from rlweave.scheduler.ray_impl.build import RoleBuilder

    cfg = run_config({"rollout": {"devices": 4, "parallel": {"tp": 2}}})
    builder = RoleBuilder(cfg, {"rollout": SPANNING}, ["rollout"])
    try:
        first = assert_replicas_own_two_devices_each(builder.build()["rollout"])
        again = assert_replicas_own_two_devices_each(builder.rebuild("rollout"))  # the same slots
        assert [set(ids) for ids in again] == [set(ids) for ids in first]
    finally:
        builder.close()


def test_replicas_colocated_with_a_trainer_share_its_devices_and_get_its_weights(cluster):
    cfg = run_config({"policy": {"devices": 4, "options": {"weights_mb": 0.05, "weights_seed": 5}},
                      "rollout": {"devices": 4, "parallel": {"tp": 2}}},
                     colocate=[["policy", "rollout"]])
    handles = build_roles(cfg, {"policy": PROBE, "rollout": SPANNING}, ["policy", "rollout"])
    try:
        policy, rollout = handles["policy"], handles["rollout"]
        ids = assert_replicas_own_two_devices_each(rollout)
        trainer = [visible(p) for p in placements(policy)]
        assert all(len(t) == 1 for t in trainer) and sorted(sum(trainer, [])) == ["0", "1", "2", "3"]
        # the same four devices: replica r on the devices of trainer ranks 2r and 2r+1
        assert [set(mine) for mine in ids] == [set(trainer[2 * r] + trainer[2 * r + 1]) for r in (0, 1)]

        prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
        out = rollout.generate(prompts, SamplingParams(n=1, max_new_tokens=2)).result(timeout=60)
        assert [g[0].token_ids[:-2] for g in out] == [list(reversed(p)) for p in prompts]  # prompt order kept
        assert {g[0].token_ids[-1] for g in out} == {0, 1}  # both replicas generated

        sent = policy.call("get_state", dispatch="rank0").result(timeout=60)
        broadcast = BroadcastTransport(timeout_s=60)
        broadcast.setup(policy, rollout)  # a gloo group of the policy's rank 0 and one rank per replica
        try:
            for transport in (None, broadcast):
                rollout.load_weights([]).result(timeout=60)  # forget the previous round
                assert sync_weights(policy, rollout, timeout_s=60, transport=transport)["tensors"] == len(sent)
                got = rollout.call("get_state").result(timeout=60)
                assert len(got) == 2  # one destination rank per replica
                for state in got:
                    assert state.keys() == sent.keys()
                    assert all(torch.equal(state[k], sent[k]) for k in sent)
        finally:
            broadcast.close()

        assert len(rollout.sleep(1).result(timeout=60)) == 2
        assert rollout.wake_up().result(timeout=60) == [None, None]
    finally:
        for h in handles.values():
            h.shutdown()
