"""Lost workers on the Ray scheduler: call timeouts from the config, dead ranks found while
the controller waits on another role, injected faults, and rebuilding a role.

One Ray cluster for the module (start-up costs seconds); every test builds and ends its own roles.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from rlweave.config.schema import RunConfig  # noqa: E402
from rlweave.plugins.types import BackendRecord  # noqa: E402
from rlweave.runner.recovery import lost_roles  # noqa: E402
from rlweave.scheduler import RoleBuilder, WorkerError, WorkerTimeout  # noqa: E402
from rlweave.scheduler import faults  # noqa: E402

PROBE = BackendRecord(name="probe", summary="test worker", target="rlweave.testing.workers:ProbeWorker")


def run_config(roles: dict) -> RunConfig:
    return RunConfig.model_validate({
        "resources": {"pools": {"main": {"devices_per_node": 4}}},
        "roles": {name: {"pool": "main", **spec} for name, spec in roles.items()},
    })


@pytest.fixture
def built(cluster):
    builders = []

    def build(roles: dict) -> tuple[RoleBuilder, dict]:
        cfg = run_config(roles)
        builder = RoleBuilder(cfg, {r: PROBE for r in roles}, list(roles))
        builders.append(builder)
        return builder, builder.build()

    yield build
    for b in builders:
        b.close()


def pids(handle) -> list[int]:
    n = handle.world_size
    return [p["pid"] for p in handle.submit_ranks("placement", list(range(n)), [((), {})] * n, list,
                                                   on_actor=True).result(timeout=60)]


def test_a_hung_call_times_out_naming_role_ranks_method_and_setting(built):
    _, roles = built({"policy": {"devices": 2, "timeouts": {"other": 2.0}}})
    policy = roles["policy"]
    fut = policy.submit_ranks("nap", [0, 1], [((0.0,), {}), ((60.0,), {})], list)
    t0 = time.monotonic()
    with pytest.raises(WorkerTimeout) as info:
        fut.result()  # no timeout given: the role's configured one applies
    took = time.monotonic() - t0
    assert 1.9 <= took < 6.0, took  # the timeout, and reading the stuck rank's stack
    err = info.value
    assert (err.role, err.method, err.ranks) == ("policy", "nap", [1])
    assert "roles.policy.timeouts.other" in str(err) and "rank(s) 1" in str(err)
    # where the stuck rank is: its sleeping frame, innermost first, under the rank's heading
    assert list(err.stacks) == [1]
    frames = err.stacks[1].splitlines()
    assert frames[1].endswith("in nap") and "rlweave/testing/workers.py" in frames[1], err.stacks[1]
    assert "--- where policy rank 1 was (most recent call first) ---" in str(err)
    assert pickle.loads(pickle.dumps(err)).stacks == err.stacks
    assert lost_roles(err) == {"policy": "rank(s) 1 hung in nap()"}
    t0 = time.monotonic()
    policy.kill()  # a hung rank is ended at once, not asked to shut down
    assert time.monotonic() - t0 < 5


def test_rlweave_stacks_prints_where_each_live_rank_is(built, tmp_path):
    from typer.testing import CliRunner

    from rlweave.cli import app

    _, roles = built({"policy": {"devices": 2}})
    policy = roles["policy"]
    rows = policy.submit_ranks("placement", [0, 1], [((), {})] * 2, list, on_actor=True).result(timeout=60)
    (tmp_path / "workers.json").write_text(json.dumps(
        {"policy": [{"rank": r, "pid": i["pid"], "node_ip": i["node_ip"], "stack_fd": i["stack_fd"]}
                    for r, i in enumerate(rows)]}))
    fut = policy.submit_ranks("nap", [0, 1], [((0.0,), {}), ((30.0,), {})], list)
    time.sleep(1.0)
    out = CliRunner().invoke(app, ["stacks", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rank1 = out.output.split("=== policy rank 1")[1]
    assert " in nap" in rank1 and "=== policy rank 0" in out.output
    policy.kill()
    del fut
    missing = CliRunner().invoke(app, ["stacks", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "workers.json: no such file" in missing.output


def test_a_process_that_did_not_arm_itself_is_never_signalled():
    from rlweave.scheduler.stacks import StackSource, dump

    # this test process has no stacks file at fd 0: SIGUSR1 would end it, so it must not be sent
    assert dump(StackSource(os.getpid(), 0, "10.0.0.9")).startswith(
        f"(no stack: process {os.getpid()} is not running on this machine (it runs on 10.0.0.9")


def test_timeout_keys_follow_the_method():
    from rlweave.scheduler.handle import RoleHandle
    from rlweave.scheduler.local import LocalWorkerGroup
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.workers import ProbeWorker

    timeouts = RunConfig.model_validate({"roles": {"policy": {"timeouts": {"train": 7}}}}).roles["policy"].timeouts
    h = RoleHandle("policy", LocalWorkerGroup("policy", ProbeWorker, [WorkerContext()]), timeouts=timeouts.model_dump())
    assert h.timeout_for("train_step") == (7.0, "roles.policy.timeouts.train")
    assert h.timeout_for("generate") == (3600.0, "roles.policy.timeouts.generate")
    assert h.timeout_for("receive_weights")[1] == "roles.policy.timeouts.sync"
    assert h.timeout_for("offload")[1] == "roles.policy.timeouts.other"
    assert RoleHandle("x", h.group).timeout_for("train_step") == (None, None)


def test_a_rank_that_dies_between_calls_is_reported_while_waiting_on_another_role(built):
    _, roles = built({"policy": {"devices": 2}, "reference": {"devices": 1}})
    victim = pids(roles["policy"])[1]
    fut = roles["reference"].call("nap", 60.0)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError) as info:
        fut.result()
    took = time.monotonic() - t0
    assert took < 15, took
    err = info.value
    assert (err.role, err.rank, err.lost) == ("policy", 1, True)
    assert "while waiting for reference.nap()" in err.method
    assert lost_roles(err) == {"policy": lost_roles(err)["policy"]} and "rank 1" in lost_roles(err)["policy"]


def test_an_ordinary_worker_exception_is_not_a_lost_worker(built):
    _, roles = built({"policy": {"devices": 1}})
    with pytest.raises(WorkerError) as info:
        roles["policy"].call("fail", "bad input").result(timeout=30)
    assert info.value.lost is False and lost_roles(info.value) == {}


def test_injected_faults_fire_on_the_nth_call_only(built, monkeypatch):
    monkeypatch.setenv(faults.ENV, "policy:1:nap:kill@2,policy:0:fail:raise")
    _, roles = built({"policy": {"devices": 2}})
    policy = roles["policy"]
    assert len(policy.call("nap", 0.0).result(timeout=30)) == 2  # first call: no fault
    with pytest.raises(WorkerError) as info:
        policy.call("nap", 0.0).result(timeout=30)
    assert (info.value.rank, info.value.lost) == (1, True)


def test_fault_rules_are_validated():
    assert faults.parse("policy:0:train_step:hang@3") == [faults.Fault("policy", 0, "train_step", "hang", 3)]
    with pytest.raises(ValueError, match="bad rule"):
        faults.parse("policy:zero:train_step:hang")
    with pytest.raises(ValueError, match="bad rule"):
        faults.parse("policy:0:train_step:explode")


def test_a_fired_rule_with_a_markers_directory_never_fires_again_in_a_new_rank(tmp_path):
    first = faults.FaultPlan("policy", 0, "policy:0:setup:raise@1", fired=str(tmp_path))
    with pytest.raises(RuntimeError, match="injected fault"):
        first.before("setup")
    assert (tmp_path / "policy-0-setup-raise-1").is_file()
    again = faults.FaultPlan("policy", 0, "policy:0:setup:raise@1", fired=str(tmp_path))  # the rank rebuilt
    again.before("setup")  # no fault
    fresh = faults.FaultPlan("policy", 0, "policy:0:setup:raise@1", fired="")  # without markers: fresh counts
    with pytest.raises(RuntimeError, match="injected fault"):
        fresh.before("setup")


def test_rebuild_starts_new_ranks_in_the_same_slots(built):
    builder, roles = built({"policy": {"devices": 2}, "reference": {"devices": 1}})
    old = pids(roles["policy"])
    os.kill(old[0], signal.SIGKILL)
    new = builder.rebuild("policy")
    assert new is builder.handles["policy"] and roles["policy"].closed
    fresh = pids(new)
    assert len(fresh) == 2 and not set(fresh) & set(old)
    assert [r["rank"] for r in new.ping().result(timeout=30)] == [0, 1]
    # the rebuilt ranks joined a new process group: a collective works across them
    assert new.call("all_reduce", 1.0).result(timeout=60) == [2.0, 2.0]
    assert roles["reference"].ping().result(timeout=30)[0]["role"] == "reference"
