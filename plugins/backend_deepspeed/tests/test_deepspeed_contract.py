"""The training-backend contract suite (:mod:`rlweave.testing.backend_contract`) on the DeepSpeed
backend: ZeRO-3 on two gloo ranks (parameters sharded, none kept whole on a rank), the
checkpoint reloaded on one rank at ZeRO-1."""

from __future__ import annotations

from typing import ClassVar

from rlweave.testing.backend_contract import BackendContractSuite


class TestDeepSpeedContract(BackendContractSuite):
    backend = "deepspeed"
    options: ClassVar[dict] = {"max_tokens_per_micro_batch": 32, "zero_stage": 3,
                               "ds_config": {"zero_optimization": {"stage3_param_persistence_threshold": 0}}}
    parallel: ClassVar[dict] = {"dp": 2}
    world_size = 2
    reload_parallel: ClassVar[dict] = {"dp": 1}
    reload_world_size = 1
    reload_options: ClassVar[dict] = {"max_tokens_per_micro_batch": 32, "zero_stage": 1}
    tolerance = 1e-5
