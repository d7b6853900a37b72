"""Placement of ranks that span several devices (a vLLM replica with ``tp`` > 1): how many
ranks a role gets, what its handle dispatches over, and the checks that keep a rank on one node."""

from __future__ import annotations

from rlweave.config.placement import check_placement, devices_per_rank, rank_parallel, spans_of
from rlweave.config.schema import RunConfig
from rlweave.plugins.types import BackendRecord, EngineRecord


def cfg(roles: dict, pools=None) -> RunConfig:
    return RunConfig.model_validate({
        "resources": {"pools": pools or {"main": {"nodes": 1, "devices_per_node": 8}}},
        "roles": {name: {"pool": "main", **spec} for name, spec in roles.items()},
    })


SPANS = {"rollout": ("tp",)}


def test_devices_per_rank_and_the_parallel_sizes_between_ranks():
    assert devices_per_rank({"tp": 2}, ("tp",)) == 2
    assert devices_per_rank({"dp": 2, "tp": 4}, ("tp",)) == 4
    assert devices_per_rank({"tp": 2}) == 1  # a record that spans nothing: one device per rank
    assert rank_parallel({"tp": 2}, ("tp",)) == {}
    assert rank_parallel({"dp": 3, "tp": 2}, ("tp",)) == {"dp": 3}
    assert rank_parallel({"dp": 2, "tp": 2}) == {"dp": 2, "tp": 2}


def test_records_say_what_a_rank_spans():
    assert spans_of(EngineRecord(name="e", summary="", target="m:x", rank_spans=("tp",))) == ("tp",)
    assert spans_of(EngineRecord(name="e", summary="", target="m:x")) == ()
    assert spans_of(BackendRecord(name="b", summary="", target="m:x")) == ()
    assert spans_of(None) == ()


def test_tp_without_dp_means_replicas_of_tp_devices():
    ok = cfg({"rollout": {"devices": 4, "parallel": {"tp": 2}}})
    assert check_placement(ok, ["rollout"], {"rollout": ("dp", "tp")}, SPANS) == []
    with_dp = cfg({"rollout": {"devices": 4, "parallel": {"dp": 2, "tp": 2}}})
    assert check_placement(with_dp, ["rollout"], {"rollout": ("dp", "tp")}, SPANS) == []


def test_tp_not_dividing_devices_is_named():
    bad = cfg({"rollout": {"devices": 3, "parallel": {"tp": 2}}})
    assert check_placement(bad, ["rollout"], {"rollout": ("dp", "tp")}, SPANS) == [(
        "roles.rollout.parallel",
        "role 'rollout': tp 2 = 2 does not divide roles.rollout.devices (3); devices must be a multiple of it "
        "(the quotient is the number of data-parallel replicas)",
    )]


def test_a_rank_must_fit_on_one_node():
    pools = {"main": {"nodes": 2, "devices_per_node": 2}}
    too_wide = cfg({"rollout": {"devices": 4, "parallel": {"tp": 4}}}, pools)
    (path, msg), = check_placement(too_wide, ["rollout"], {"rollout": ("tp",)}, SPANS)
    assert path == "roles.rollout.parallel"
    assert "one rank spans 4 devices" in msg and "a node of pool 'main' has only 2" in msg
    assert "resources.pools.main.devices_per_node" in msg
    # the same role whose plugin runs tp across ranks (one device each) is fine
    assert check_placement(too_wide, ["rollout"], {"rollout": ("tp",)}) == []


def test_a_rank_must_not_straddle_nodes():
    uneven = cfg({"rollout": {"devices": 6, "parallel": {"tp": 2}}}, {"main": {"nodes": 2, "devices_per_node": 3}})
    (path, msg), = check_placement(uneven, ["rollout"], {"rollout": ("dp", "tp")}, SPANS)
    assert path == "roles.rollout.parallel" and "does not divide resources.pools.main.devices_per_node (3)" in msg
    shifted = cfg({"policy": {"devices": 1}, "rollout": {"devices": 2, "parallel": {"tp": 2}}},
                  {"main": {"nodes": 2, "devices_per_node": 4}})
    (path, msg), = check_placement(shifted, ["policy", "rollout"], {"rollout": ("dp", "tp")}, SPANS)
    assert path == "roles.rollout.parallel"
    assert "start at device 1 of pool 'main'" in msg and "not on a multiple of 2" in msg
    # listed first, the rollout starts on a node boundary
    assert check_placement(shifted, ["rollout", "policy"], {"rollout": ("dp", "tp")}, SPANS) == []


def test_validation_checks_a_replica_fits_on_one_node(tmp_path, monkeypatch):
    """``rlweave validate``'s placement pass knows the selected engine's rank spans: a vLLM
    replica wider than a node is a config error before any worker starts."""
    import yaml

    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    monkeypatch.chdir(tmp_path)
    data = {
        "algorithm": {"name": "grpo"},
        "resources": {"pools": {"main": {"nodes": 2, "devices_per_node": 2}}},
        "roles": {"policy": {"backend": "fsdp", "pool": "main", "devices": 2},
                  "rollout": {"engine": "vllm", "pool": "main", "devices": 4, "parallel": {"tp": 4}}},
        "rewards": [{"name": "arith_exact"}],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    try:
        load_config("c.yaml")
    except ConfigError as err:
        text = str(err)
    else:  # pragma: no cover - the test fails below
        text = ""
    assert "roles.rollout.parallel" in text and "one rank spans 4 devices" in text, text
