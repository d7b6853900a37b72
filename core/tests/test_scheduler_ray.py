"""Ray scheduler on 4 virtual GPUs: placement and colocation, gloo all-reduce, dp
scatter/gather, remote errors with role and rank, overlapping calls, loopback-only cluster.

One Ray cluster for the module (start-up costs seconds); the roles of the first tests are
built once and shut down by the last test, which needs all four devices for one group.
"""

from __future__ import annotations

import ipaddress
import time

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from rlweave.config.schema import RunConfig  # noqa: E402
from rlweave.data.batch import Batch  # noqa: E402
from rlweave.interfaces.engine import SamplingParams  # noqa: E402
from rlweave.plugins.types import BackendRecord, EngineRecord  # noqa: E402
from rlweave.scheduler import WorkerError, build_roles  # noqa: E402
from rlweave.scheduler.future import wait_any  # noqa: E402
from rlweave.scheduler.ray_impl.cluster import ray_processes  # noqa: E402

PROBE = BackendRecord(name="probe", summary="test worker", target="rlweave.testing.workers:ProbeWorker",
                      parallel=("dp", "tp"))
ENGINE = EngineRecord(name="probe-engine", summary="test engine", target="rlweave.testing.workers:ProbeEngine")


def run_config(roles: dict, colocate=None, devices: int = 4) -> RunConfig:
    return RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": devices}}, "colocate": colocate or []},
        "roles": {name: {"pool": "main", **spec} for name, spec in roles.items()},
    })


@pytest.fixture(scope="module")
def roles(cluster):
    cfg = run_config(
        {"policy": {"devices": 2, "options": {"tag": "p"}}, "reference": {"devices": 2, "cpu_threads": 3},
         "rollout": {"devices": 2}},
        colocate=[["policy", "reference"]],
    )
    handles = build_roles(cfg, {"policy": PROBE, "reference": PROBE, "rollout": ENGINE},
                          ["policy", "reference", "rollout"])
    yield handles
    for h in handles.values():
        h.shutdown()


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


def on_actor(handle, method):
    return handle.submit_ranks(method, list(range(handle.world_size)), [((), {})] * handle.world_size, list,
                          on_actor=True).result(timeout=60)


def test_local_cluster_is_loopback_only_without_dashboard(cluster):
    import psutil

    procs = ray_processes()
    assert any(p.name() == "raylet" for p in procs) and any(p.name() == "gcs_server" for p in procs)
    listening = []
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        listening += [(p.name(), c.laddr.ip) for c in conns if c.status == psutil.CONN_LISTEN]
    assert listening, "expected Ray processes to listen somewhere"
    assert all(_loopback(ip) for _, ip in listening), listening
    cmdlines = [" ".join(p.cmdline()) for p in procs]
    # without ray.dashboard Ray keeps only its API head process, started with the UI off
    heads = [c for c in cmdlines if "dashboard/dashboard.py" in c]
    assert all("--disable-frontend" in c for c in heads), heads
    assert ray.cluster_resources()["GPU"] == 4


def test_placement_and_colocation(roles):
    pol, ref, rol = (on_actor(roles[r], "placement") for r in ("policy", "reference", "rollout"))
    # one placement group for the pool, four bundles of one GPU each
    pg_ids = {p["placement_group_id"] for p in pol + ref + rol}
    assert len(pg_ids) == 1
    table = ray.util.placement_group_table()[pg_ids.pop()]
    assert len(table["bundles"]) == 4 and all(b["GPU"] == 1 for b in table["bundles"].values())
    # colocated ranks share a device, other slots do not
    pol_gpus = [p["gpu_ids"] for p in pol]
    assert pol_gpus == [p["gpu_ids"] for p in ref]
    assert all(len(g) == 1 for g in pol_gpus + [p["gpu_ids"] for p in rol])
    assert len({g[0] for g in pol_gpus}) == 2
    assert {g[0] for g in pol_gpus}.isdisjoint({p["gpu_ids"][0] for p in rol})
    assert {g[0] for g in pol_gpus} | {p["gpu_ids"][0] for p in rol} == {"0", "1", "2", "3"}
    assert [p["cuda_visible_devices"] for p in pol] == [g[0] for g in pol_gpus]
    # CPU threads (virtual devices are CPU): the node's cores split over a role's ranks, or as configured
    import os

    auto = max(1, (os.cpu_count() or 1) // 2)
    assert [(p["torch_threads"], p["omp_num_threads"]) for p in pol] == [(auto, str(auto))] * 2
    assert [p["torch_threads"] for p in ref] == [3, 3]
    # on a GPU-less machine every rank starts keeping freed memory for reuse (no page faults re-allocating it)
    info = roles["policy"].call("placement").result(timeout=60) + roles["reference"].call("placement").result(timeout=60)
    assert [i["started_with_glibc_tunables"] for i in info] == [True] * 4
    assert [p["cpu_malloc_reuse"] for p in pol + ref] == [True] * 4  # applied by the actor's setup
    faults = roles["policy"].call("realloc_page_faults").result(timeout=60)
    assert max(faults) < 500, faults  # glibc's defaults: ~8,192 (tests/test_malloc.py)
    # every rank in its own process, context filled by the controller
    assert len({p["pid"] for p in pol + ref + rol}) == 6
    # ranks of a local cluster run at Ray's niceness (ray.worker_niceness null: 15, or RAY_worker_niceness)
    niceness = int(os.environ.get("RAY_worker_niceness", "15"))
    assert {os.getpriority(os.PRIO_PROCESS, p["pid"]) for p in pol + ref + rol} == {niceness}
    info = roles["policy"].call("placement").result(timeout=60)
    assert [i["rank"] for i in info] == [0, 1] and {i["world_size"] for i in info} == {2}
    assert {i["device"] for i in info} == {"cpu"}
    masters = {i["master"] for i in info}
    assert len(masters) == 1 and masters.pop().startswith("127.0.0.1:")
    ref_master = roles["reference"].call("placement").result(timeout=60)[0]["master"]
    assert ref_master != info[0]["master"]


def test_gloo_all_reduce_in_each_group(roles):
    assert roles["policy"].call("all_reduce", 1.5).result(timeout=60) == [3.0, 3.0]
    assert roles["reference"].call("all_reduce", 2.0).result(timeout=60) == [4.0, 4.0]


def test_dp_scatter_gather_round_trip_over_ray(roles):
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, 99, (int(n),), generator=g).tolist() for n in torch.randint(1, 20, (13,), generator=g)]
    b = Batch.from_sequences(seqs, ids=[f"x{i}" for i in range(13)])
    out = roles["policy"].logprobs(b).result(timeout=60)
    torch.testing.assert_close(out["logprobs"], b.token["input_ids"].double())
    assert sorted(set(out["rank"])) == [0, 1]
    assert roles["policy"].call("echo_ids", b, dispatch="dp").result(timeout=60) == b.ids
    torch.testing.assert_close(roles["reference"].scores(b).result(timeout=60),
                               torch.tensor([float(sum(s)) for s in seqs], dtype=torch.float64))


def test_generate_in_prompt_order(roles):
    prompts = [[i, i + 1] * (1 + i % 3) for i in range(7)]
    gens = roles["rollout"].generate(prompts, SamplingParams(n=1)).result(timeout=60)
    assert [g[0].token_ids[:-2] for g in gens] == [list(reversed(p)) for p in prompts]
    assert {g[0].token_ids[-1] for g in gens} == {0, 1}


def test_remote_error_names_role_and_rank(roles):
    b = Batch.from_sequences([[1, 2], [3, 4, 5]])
    with pytest.raises(WorkerError) as ei:
        roles["reference"].call("fail", "bad input", dispatch="rank0").result(timeout=60)
    err = ei.value
    assert (err.role, err.rank, err.method) == ("reference", 0, "fail")
    assert "role 'reference' rank 0" in str(err) and "ValueError: bad input" in str(err)
    assert "remote traceback" in str(err) and "workers.py" in err.remote_traceback
    assert isinstance(err.cause, ValueError)
    with pytest.raises(WorkerError, match="has no method 'nope'"):
        roles["policy"].call("nope").result(timeout=60)
    # the group still works after a failed call
    assert roles["policy"].call("echo_ids", b, dispatch="dp").result(timeout=60) == ["0", "1"]


def test_independent_calls_overlap(roles):
    start = time.monotonic()
    f1 = roles["policy"].call("nap", 1.5)
    f2 = roles["reference"].call("nap", 1.5)
    assert not f1.done()
    spans = f1.result(timeout=30) + f2.result(timeout=30)
    elapsed = time.monotonic() - start
    assert elapsed < 2.5, f"4 naps of 1.5 s took {elapsed:.2f} s: calls did not overlap"
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all four ran at the same time


def test_wait_any_sleeps_until_a_whole_call_is_done(roles):
    """One call of two roles' ranks each: wait_any returns when every rank of one call is done,
    not when one rank of the other is, and the controller sleeps meanwhile (no polling)."""
    uneven = roles["policy"].submit_ranks("nap", [0, 1], [((0.05,), {}), ((4.0,), {})], list)
    even = roles["reference"].call("nap", 1.5)
    t0, cpu0 = time.monotonic(), time.process_time()
    wait_any([uneven, even], timeout=30)
    waited, cpu = time.monotonic() - t0, time.process_time() - cpu0
    assert even.done() and not uneven.done(), waited
    assert 1.3 < waited < 4.0, waited
    assert cpu < 0.5 * waited, f"the controller used {cpu:.2f} s of CPU in a {waited:.2f} s wait"
    t0 = time.monotonic()
    wait_any([uneven, uneven], timeout=0.5)  # the same call twice: one wait on its ranks
    assert not uneven.done() and 0.45 < time.monotonic() - t0 < 2.0
    assert len(uneven.result(timeout=30)) == 2 and len(even.result(timeout=30)) == 2


def test_group_of_four_all_reduce_and_dead_rank(cluster, roles):
    for h in roles.values():  # give the four devices back (also checks the placement group is removed)
        h.shutdown()
    deadline = time.monotonic() + 10
    while ray.available_resources().get("GPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == 4
    cfg = run_config({"critic": {"devices": 4, "parallel": {"dp": 2, "tp": 2}}})
    critic = build_roles(cfg, {"critic": PROBE}, ["critic"])["critic"]
    try:
        assert critic.call("all_reduce", 1.0).result(timeout=60) == [4.0] * 4
        assert critic.dp == 2
        with pytest.raises(WorkerError) as ei:
            critic.submit_ranks("die", [2], [((), {})], list).result(timeout=60)
        assert ei.value.role == "critic" and ei.value.rank == 2 and "died" in str(ei.value)
    finally:
        critic.shutdown()
