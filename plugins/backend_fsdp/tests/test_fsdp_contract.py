"""The training-backend contract suite (:mod:`rlweave.testing.backend_contract`) on the FSDP
backend: two gloo ranks (data parallel, uneven shards), the checkpoint reloaded on one."""

from __future__ import annotations

from typing import ClassVar

from rlweave.testing.backend_contract import BackendContractSuite


class TestFSDPContract(BackendContractSuite):
    backend = "fsdp"
    options: ClassVar[dict] = {"max_tokens_per_micro_batch": 32}
    parallel: ClassVar[dict] = {"dp": 2}
    world_size = 2
    reload_parallel: ClassVar[dict] = {"dp": 1}
    reload_world_size = 1
    tolerance = 1e-5
