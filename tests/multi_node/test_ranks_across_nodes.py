"""Ranks of two roles spread over three nodes of the shared cluster (probe workers, real Ray
actors, this process the controller), joined with ``ray.address`` on a GPU-less machine:

* the ranks of a gpu pool run on CPU (the cluster's GPUs are virtual) with the CPU process settings;
* weights move between nodes through the object store (what ``auto`` picks on CPU) and over a
  gloo broadcast group, arriving intact on every rank; ``cuda_ipc`` is refused, naming the nodes;
* the shared-filesystem check passes on nodes that see the run directory and refuses, naming
  role, rank and node, a node whose processes do not see it.
"""

from __future__ import annotations

import os

import pytest
import ray

torch = pytest.importorskip("torch")

from rlweave.config.schema import RunConfig, WeightSyncSection  # noqa: E402
from rlweave.runner.shared_fs import PROBE_DIR, SharedFilesystemError, check_shared_run_dir  # noqa: E402
from rlweave.scheduler import build_roles  # noqa: E402
from rlweave.testing.workers import PROBE, PROBE_ENGINE, make_state_dict  # noqa: E402
from rlweave.weight_sync import (  # noqa: E402
    BroadcastTransport,
    CudaIpcTransport,
    WeightSync,
    WeightSyncError,
    sync_weights,
)
from rlweave.weight_sync.auto import locate  # noqa: E402

from .conftest import SPREAD, unshare_prefix  # noqa: E402

MB, SEED, BUCKET = 2, 13, 256 << 10


@pytest.fixture(scope="module")
def roles(nodes):
    """policy (1 rank) and rollout (2 ranks, bf16 weights) in one pool of one device per node:
    three ranks, three nodes."""
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"spread": {"nodes": SPREAD, "devices_per_node": 1}}},
        "roles": {"policy": {"pool": "spread", "devices": 1, "options": {"weights_mb": MB, "weights_seed": SEED}},
                  "rollout": {"pool": "spread", "devices": 2, "options": {"weight_dtype": "bfloat16"}}},
    })
    handles = build_roles(cfg, {"policy": PROBE, "rollout": PROBE_ENGINE}, ["policy", "rollout"])
    yield handles
    for h in handles.values():
        h.shutdown()


def placements(handle) -> list[dict]:
    ranks = list(range(handle.world_size))
    return handle.submit_ranks("placement", ranks, [((), {})] * len(ranks), list, on_actor=True).result(timeout=60)


def assert_received(handle) -> None:
    sent = make_state_dict(MB, SEED)
    want = {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in sent.items()}
    for state in handle.call("get_state").result(timeout=60):  # every rank, every tensor
        assert list(state) == list(want)
        for name, t in want.items():
            assert state[name].dtype == t.dtype and torch.equal(state[name], t), name
    handle.call("load_weights", []).result(timeout=60)  # emptied: the next sync must fill it again


def test_ranks_of_a_gpu_pool_on_a_joined_gpu_less_cluster_run_on_cpu(roles, nodes):
    """Three ranks on three distinct GPU nodes; each holds one of Ray's virtual GPUs, sees no
    CUDA device, so it runs on CPU with the CPU process settings applied."""
    where = placements(roles["policy"]) + placements(roles["rollout"])
    assert len({p["node_id"] for p in where}) == 3 and {p["node_id"] for p in where} <= set(nodes.gpu_node_ids())
    assert all(p["gpu_ids"] and p["cpu_malloc_reuse"] and p["torch_threads"] for p in where), where
    located = locate(roles["policy"], [0], 60) + locate(roles["rollout"], [0, 1], 60)
    assert [p["device"] for p in located] == ["cpu"] * 3


def test_weights_cross_nodes_through_the_object_store_which_auto_picks(roles):
    ws = WeightSync(roles, WeightSyncSection(transport="auto", bucket_mb=BUCKET / (1 << 20), timeout_s=60))
    try:
        stats = ws.sync("policy", "rollout")
        assert ws.transport("policy", "rollout").name == "object_store"
    finally:
        ws.close()
    assert stats["buckets"] >= 2 and stats["dtype"] == "bfloat16"
    assert_received(roles["rollout"])


def test_weights_cross_nodes_over_a_gloo_broadcast_group(roles):
    transport = BroadcastTransport(timeout_s=60)
    transport.setup(roles["policy"], roles["rollout"])
    try:
        stats = sync_weights(roles["policy"], roles["rollout"], bucket_bytes=BUCKET, timeout_s=60,
                             transport=transport)
        assert transport.backend == "gloo"
    finally:
        transport.close()
    assert stats["buckets"] >= 2
    assert_received(roles["rollout"])


def test_cuda_ipc_is_refused_between_nodes_naming_them(roles):
    """Memory handles do not cross nodes, even nodes that share a machine: the setup says which
    rank runs on which node and what to use instead."""
    policy_node = placements(roles["policy"])[0]["node_id"]
    rollout_node = placements(roles["rollout"])[0]["node_id"]
    transport = CudaIpcTransport(timeout_s=60)
    with pytest.raises(WeightSyncError) as ei:
        transport.setup(roles["policy"], roles["rollout"])
    msg = str(ei.value)
    assert "'rollout' rank 0" in msg and "one node" in msg and "broadcast or object_store" in msg
    assert policy_node[:12] in msg and rollout_node[:12] in msg
    transport.close()


def test_shared_fs_check_passes_on_nodes_that_see_the_run_directory(roles, tmp_path):
    check_shared_run_dir(tmp_path / "run", roles, timeout_s=60)
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / PROBE_DIR).exists()


def _listing(worker, rank, directory):  # noqa: ARG001 - runs in a rank's process
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else None


def test_shared_fs_check_refuses_a_node_that_cannot_see_the_run_directory(roles, nodes, tmp_path):
    """A node whose raylet (and so every worker it starts) runs in a mount namespace of its own
    with an empty tmpfs over ``shared/``, the folder holding the run directory: its processes see
    an empty folder where the controller and the other nodes see the run's files, exactly as a
    node that does not mount the run's filesystem (its writes land on its own disk). Nothing in
    the check is told about it. The role placed there (the only node with two GPUs) fails the
    check, named with its rank and node; the roles on the other nodes are not blamed."""
    shared = tmp_path / "shared"
    run_dir = shared / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "config.resolved.yaml").write_text("run: {}\n")
    scratch = tmp_path / "probe"
    scratch.mkdir()
    prefix = unshare_prefix(scratch)
    if prefix is None:
        pytest.skip("this machine allows no mount namespace (unshare), neither as root nor in a user namespace")
    cfg = RunConfig.model_validate({
        "resources": {"pools": {"lonely": {"devices_per_node": 2, "strategy": "STRICT_PACK"}}},
        "roles": {"reference": {"pool": "lonely", "devices": 2}},
    })
    with nodes.private_node(shared, gpus=2, prefix=prefix) as private:
        reference = build_roles(cfg, {"reference": PROBE}, ["reference"])["reference"]
        try:
            assert {p["node_id"] for p in placements(reference)} == {private}
            seen = reference.submit_ranks("listing", [0], [((str(run_dir),), {})], list, fn=_listing).result(60)
            assert seen == [None] and (run_dir / "config.resolved.yaml").is_file()  # its view: no run directory
            with pytest.raises(SharedFilesystemError) as ei:
                check_shared_run_dir(run_dir, {**roles, "reference": reference}, timeout_s=60)
        finally:
            reference.shutdown()
    msg = str(ei.value)
    for rank in (0, 1):
        assert f"role 'reference' rank {rank} on node" in msg
    assert f"Ray node {private[:12]}" in msg and "does not see the controller's files" in msg
    assert "'policy'" not in msg and "'rollout'" not in msg and "run.output_dir" in msg
    assert not (run_dir / PROBE_DIR).exists()
