"""Shared fixtures of the core tests."""

from __future__ import annotations

import sys
import types

import pytest


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster (2 CPUs, 4 virtual GPUs) for one test module, shut down after it."""
    pytest.importorskip("ray")
    from rlweave.config.schema import RaySection
    from rlweave.scheduler import shutdown_ray, start_ray

    shutdown_ray()
    start_ray(RaySection(num_cpus=2, virtual_gpus=4))
    yield
    shutdown_ray()


@pytest.fixture
def use_plugins(monkeypatch):
    """``use_plugins(pm)``: the command line resolves plugins with ``pm`` (e.g. the in-process
    test plugins of ``plugin_dists/fakes.py``) and every placement passes; returns ``pm``."""

    def install(pm):
        from rlweave.commands import plugins

        monkeypatch.setattr(plugins, "plugin_manager", lambda: pm)
        fake = types.ModuleType("rlweave.config.placement")
        fake.check_placement = lambda cfg, roles, supported=None, rank_spans=None: []
        fake.spans_of = lambda record: ()
        monkeypatch.setitem(sys.modules, "rlweave.config.placement", fake)
        return pm

    return install
