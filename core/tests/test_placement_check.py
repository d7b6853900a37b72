"""Placement validation: pools, colocation groups, capacity arithmetic, parallel sizes."""

from __future__ import annotations

import pytest

from rlweave.config.placement import PlacementError, check_placement, pool_layout, required_devices
from rlweave.config.schema import RunConfig


def cfg(roles: dict, pools=None, colocate=None) -> RunConfig:
    return RunConfig.model_validate({
        "resources": {"pools": pools or {"main": {"nodes": 1, "devices_per_node": 8}}, "colocate": colocate or []},
        "roles": {name: {"pool": "main", **spec} for name, spec in roles.items()},
    })


THREE = {"policy": {"devices": 8}, "reference": {"devices": 8}, "critic": {"devices": 8}}


def test_three_roles_without_colocation_rejected_with_arithmetic():
    errors = check_placement(cfg(THREE), ["policy", "reference", "critic"])
    assert errors == [(
        "resources.pools.main",
        "pool 'main' has 1 node x 8 devices = 8; needs policy 8 + reference 8 + critic 8 = 24 (no colocation)",
    )]


def test_colocation_makes_it_fit_and_shows_group_when_not():
    ok = cfg(THREE, colocate=[["policy", "reference", "critic"]])
    assert check_placement(ok, ["policy", "reference", "critic"]) == []
    partly = cfg(THREE, colocate=[["policy", "reference"]])
    (path, msg), = check_placement(partly, ["policy", "reference", "critic"])
    assert path == "resources.pools.main"
    assert msg == ("pool 'main' has 1 node x 8 devices = 8; "
                   "needs [policy 8, reference 8 colocated] 8 + critic 8 = 16")


def test_only_needed_roles_count():
    assert check_placement(cfg(THREE), ["policy"]) == []


def test_multi_node_capacity():
    pools = {"main": {"nodes": 2, "devices_per_node": 4}}
    c = cfg({"policy": {"devices": 8}, "rollout": {"devices": 4}}, pools=pools)
    (path, msg), = check_placement(c, ["policy", "rollout"])
    assert msg.startswith("pool 'main' has 2 nodes x 4 devices = 8; needs policy 8 + rollout 4 = 12")


def test_unknown_pool_and_missing_role():
    c = cfg({"policy": {"devices": 1, "pool": "gpus"}})
    errors = dict(check_placement(c, ["policy", "rollout"]))
    assert "unknown pool 'gpus'" in errors["roles.policy.pool"] and "main" in errors["roles.policy.pool"]
    assert "not configured" in errors["roles.rollout"]


def test_colocation_group_errors():
    pools = {"main": {"devices_per_node": 8}, "other": {"devices_per_node": 8}}
    roles = {"policy": {"devices": 2}, "rollout": {"devices": 2, "pool": "other"}, "reference": {"devices": 2}}
    c = cfg(roles, pools=pools, colocate=[["policy", "ghost"], ["reference", "reference"], ["policy", "rollout"]])
    errors = check_placement(c, ["policy", "rollout", "reference"])
    msgs = [f"{p}: {m}" for p, m in errors]
    assert any(p == "resources.colocate.0" and "unknown role 'ghost'" in m for p, m in errors), msgs
    assert any(p == "resources.colocate.1" and "listed twice" in m for p, m in errors), msgs
    assert any(p == "resources.colocate.2" and "already in resources.colocate.0" in m for p, m in errors), msgs
    assert any(p == "resources.colocate.2" and "share one pool" in m and "rollout in 'other'" in m
               for p, m in errors), msgs


def test_parallel_product_and_support():
    c = cfg({"policy": {"devices": 4, "parallel": {"dp": 2, "tp": 3}}})
    (path, msg), = check_placement(c, ["policy"])
    assert path == "roles.policy.parallel"
    assert "dp 2 * tp 3 = 6, but roles.policy.devices is 4" in msg
    c2 = cfg({"policy": {"devices": 4, "parallel": {"dp": 2, "tp": 2}}})
    assert check_placement(c2, ["policy"]) == []
    errors = check_placement(c2, ["policy"], {"policy": ("dp",)})
    assert errors == [("roles.policy.parallel.tp",
                       "role 'policy': the selected plugin does not support parallel size 'tp' (supported: dp)")]


def test_expert_parallel_size_splits_the_data_parallel_replicas():
    ok = [{"devices": 4, "parallel": {"ep": 2}}, {"devices": 4, "parallel": {"dp": 2, "tp": 2, "ep": 2}},
          {"devices": 4, "parallel": {"dp": 4, "ep": 4}}]
    for spec in ok:  # ep takes no devices of its own
        assert check_placement(cfg({"policy": spec}), ["policy"]) == [], spec
    (path, msg), = check_placement(cfg({"policy": {"devices": 4, "parallel": {"tp": 2, "ep": 4}}}), ["policy"])
    assert path == "roles.policy.parallel.ep" and "ep=4 must divide the data-parallel size 2" in msg
    (path, msg), = check_placement(cfg({"policy": {"devices": 4, "parallel": {"dp": 2, "ep": 2}}}), ["policy"])
    assert path == "roles.policy.parallel" and "dp 2 = 2, but roles.policy.devices is 4" in msg


def test_layout_offsets_and_required_devices():
    roles = {"policy": {"devices": 2}, "rollout": {"devices": 2}, "reference": {"devices": 1}}
    c = cfg(roles, pools={"main": {"devices_per_node": 4}}, colocate=[["policy", "reference"]])
    layout = pool_layout(c, ["policy", "rollout", "reference"])["main"]
    assert [(s.roles, s.devices, s.offset) for s in layout.slots] == [
        (("policy", "reference"), 2, 0), (("rollout",), 2, 2)]
    assert required_devices(c, ["policy", "rollout", "reference"]) == 4
    assert required_devices(c, ["policy", "rollout", "reference"], device="cpu") == 0


def test_placement_error_lists_everything():
    err = PlacementError([("a.b", "first"), ("c", "second")])
    assert isinstance(err, ValueError)
    assert "a.b: first" in str(err) and "c: second" in str(err)
    with pytest.raises(PlacementError):
        raise err
