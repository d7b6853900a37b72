"""The training-backend contract suite (:mod:`rlweave.testing.backend_contract`) on the megatron
backend: two gloo ranks in one tensor-parallel group, the checkpoint reloaded on one rank (tp 1).
Skipped, with the record's reason, where megatron-core is not installed."""

from __future__ import annotations

from typing import ClassVar

from rlweave.testing.backend_contract import BackendContractSuite


class TestMegatronContract(BackendContractSuite):
    backend = "megatron"
    options: ClassVar[dict] = {"max_tokens_per_micro_batch": 64, "transformer_impl": "local"}
    parallel: ClassVar[dict] = {"tp": 2}
    world_size = 2
    reload_parallel: ClassVar[dict] = {}
    reload_world_size = 1
    tolerance = 1e-5
