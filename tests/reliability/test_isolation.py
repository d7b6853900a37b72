"""What a run exposes and what it imports:

* a local Ray cluster listens on loopback only, with the dashboard off;
* ``RLWEAVE_PLUGINS`` / ``RLWEAVE_DISABLE_PLUGINS`` keep an installed plugin from being imported.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


def test_local_ray_listens_on_loopback_only_without_dashboard(guarantee):
    pytest.importorskip("ray")
    import psutil

    from rlweave.config.schema import RaySection
    from rlweave.scheduler import ray_session
    from rlweave.scheduler.ray_impl.cluster import ray_processes

    with ray_session(RaySection(num_cpus=1)):
        procs = ray_processes()
        sockets = []
        for p in procs:
            try:
                sockets += [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                continue
        heads = [" ".join(p.cmdline()) for p in procs if "dashboard/dashboard.py" in " ".join(p.cmdline())]
    assert sockets, "expected Ray processes to listen somewhere"
    outside = [f"{a.ip}:{a.port}" for a in sockets if not _loopback(a.ip)]
    assert not outside, outside
    assert all("--disable-frontend" in h for h in heads), heads  # the dashboard UI is off
    guarantee("a local Ray cluster listens on loopback only, dashboard off",
              f"{len(sockets)} listening sockets of {len(procs)} Ray processes, all on loopback; dashboard UI off")


PROBE = """
import json, sys
from rlweave.plugins.manager import get_plugin_manager
pm = get_plugin_manager()
print(json.dumps({"imported": sorted(m for m in sys.modules if m.startswith("rlweave_")),
                  "status": {p.entry_point: p.status for p in pm.plugins}}))
"""


def _probe(env_extra: dict[str, str]) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RLWEAVE_PLUGINS", "RLWEAVE_DISABLE_PLUGINS")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plugin_allow_and_block_lists_keep_plugins_from_being_imported(guarantee):
    everything = _probe({})
    installed = sorted(ep for ep in everything["status"] if not ep.startswith("builtin-"))  # the core's own stay on
    if len(installed) < 2:
        pytest.skip("needs two installed plugins")
    keep, block = installed[0], installed[1]
    allowed = _probe({"RLWEAVE_PLUGINS": keep})
    blocked = _probe({"RLWEAVE_DISABLE_PLUGINS": block})
    assert allowed["status"][keep] != "disabled" and allowed["status"][block] == "disabled"
    assert blocked["status"][block] == "disabled" and blocked["status"][keep] != "disabled"
    # a disabled plugin's module is never imported
    block_pkg = _package(block)
    assert block_pkg in {m.split(".")[0] for m in everything["imported"]}
    assert block_pkg not in {m.split(".")[0] for m in allowed["imported"]}
    assert block_pkg not in {m.split(".")[0] for m in blocked["imported"]}
    guarantee("RLWEAVE_PLUGINS / RLWEAVE_DISABLE_PLUGINS keep an installed plugin from being imported",
              f"{block} ({block_pkg}) imported by default, not imported when disabled or not allowed "
              f"({len(installed)} plugins installed)")


def _package(entry_point: str) -> str:
    """The top-level package an installed ``rlweave.plugins`` entry point loads."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="rlweave.plugins"):
        if ep.name == entry_point:
            return ep.value.split(":")[0].split(".")[0]
    raise LookupError(entry_point)
