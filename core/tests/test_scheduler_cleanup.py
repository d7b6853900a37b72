"""No Ray or worker processes survive a run, whether it ends normally or by an error.

Each case runs a small driver in a subprocess (start Ray, build a one-rank role, call it)
that writes the pids of every Ray process it started; after it exits none may be alive.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("ray")

DRIVER = textwrap.dedent(
    """
    import json, sys
    from rlweave.config.schema import RaySection, RunConfig
    from rlweave.plugins.types import BackendRecord
    from rlweave.scheduler import build_roles, ray_session
    from rlweave.scheduler.ray_impl.cluster import ray_processes

    mode, pid_file = sys.argv[1], sys.argv[2]
    cfg = RunConfig.model_validate({
        "ray": {"num_cpus": 1, "virtual_gpus": 1},
        "resources": {"pools": {"main": {"devices_per_node": 1}}},
        "roles": {"policy": {"pool": "main", "devices": 1}},
    })
    rec = BackendRecord(name="probe", summary="t", target="rlweave.testing.workers:ProbeWorker")
    with ray_session(cfg.ray):
        policy = build_roles(cfg, {"policy": rec}, ["policy"])["policy"]
        policy.call("ping").result(timeout=60)
        with open(pid_file, "w") as f:
            json.dump([p.pid for p in ray_processes()], f)
        if mode == "error":
            policy.call("fail", "boom").result(timeout=60)  # WorkerError leaves the session
    print("clean exit")
    """
)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


@pytest.mark.parametrize("mode", ["normal", "error"])
def test_no_processes_left(tmp_path, mode):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pid_file = tmp_path / "pids.json"
    proc = subprocess.run([sys.executable, str(script), mode, str(pid_file)], capture_output=True, text=True,
                          timeout=240)
    if mode == "normal":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "clean exit" in proc.stdout
    else:
        assert proc.returncode != 0
        assert "WorkerError: role 'policy' rank 0: fail() failed: ValueError: boom" in proc.stderr, proc.stderr[-3000:]
    pids = json.loads(pid_file.read_text())
    assert len(pids) >= 4  # gcs, raylet, agents, the rank's worker at least
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(pids) == [], f"Ray processes left after a {mode} end: {_alive(pids)}"
