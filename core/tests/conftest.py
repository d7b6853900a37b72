"""Shared fixtures of the core tests."""

from __future__ import annotations

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
