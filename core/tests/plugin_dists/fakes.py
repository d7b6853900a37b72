"""In-process test plugins for CONFIG tests (discovery tests use real entry points).

:func:`make_pm` returns a :class:`PluginManager` without entry points, with records
registered through the normal hook path (:meth:`PluginManager.register`) under the
distribution names the real plugins use, so messages look like a real installation;
:func:`changed` writes a test's config variants. Targets point nowhere (validation never imports them), except the rewards': the input
checks dry-run a reward in a worker process when the config names data files.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from rlweave.plugins import AlgorithmRecord, BackendRecord, EngineRecord, KernelRecord, RewardRecord, hookimpl
from rlweave.plugins.manager import PluginManager


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FsdpOptions(_Strict):
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    reshard: bool = Field(True, description="Reshard after forward.")


class VllmOptions(_Strict):
    gpu_memory_utilization: float = Field(0.15, gt=0, le=1, description="Memory fraction.")


class GrpoOptions(_Strict):
    group_size: int = Field(4, ge=2, description="Samples per prompt.")
    kl_beta: float = Field(0.0, ge=0, description="KL penalty weight (0: no reference role).")


class FormatArgs(_Strict):
    pattern: str = Field(r"Answer: \d+", description="Regex the response must match.")


def plugin(**hooks: Callable[[], list[Any]]) -> types.ModuleType:
    """A module-like plugin object whose functions are hookimpls."""
    module = types.ModuleType("fake_plugin")
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    return module


def grpo_roles(cfg: GrpoOptions) -> tuple[str, ...]:
    return ("policy", "rollout") + (("reference",) if cfg.kl_beta else ())


def make_pm() -> PluginManager:
    pm = PluginManager(load_entry_points=False)
    pm.register(plugin(rlweave_training_backends=lambda: [BackendRecord(
        "fsdp", "torch FSDP2", "x:y", FsdpOptions, parallel=("dp",))]),
        name="fsdp", distribution="rlweave-backend-fsdp", version="0.1.0")
    pm.register(plugin(rlweave_training_backends=lambda: [BackendRecord(
        "megatron", "megatron-core", "x:y", None, parallel=("dp", "tp", "pp"))]),
        name="megatron", distribution="rlweave-backend-megatron", version="0.1.0")
    pm.register(plugin(rlweave_inference_engines=lambda: [EngineRecord("vllm", "vLLM", "x:y", VllmOptions, parallel=("tp",))]),
                name="vllm", distribution="rlweave-infer-vllm", version="0.1.0")
    pm.register(plugin(rlweave_inference_engines=lambda: [EngineRecord("hf", "HF generate", "x:y")]),
                name="hf", distribution="rlweave-infer-hf", version="0.1.0")
    pm.register(plugin(rlweave_algorithms=lambda: [
        AlgorithmRecord("grpo", "GRPO", "x:y", GrpoOptions, roles=grpo_roles),
        AlgorithmRecord("sft", "SFT", "x:y", None, roles=lambda cfg: ("policy",))]),
        name="grpo", distribution="rlweave-algo-grpo", version="0.1.0")
    pm.register(plugin(rlweave_rewards=lambda: [RewardRecord("arith_exact", "exact", "rlweave.rewards.rules:arith_exact"),
                                                RewardRecord("format", "regex", "rlweave.rewards.rules:format_reward",
                                                             FormatArgs)],
                       rlweave_kernels=lambda: [KernelRecord("moe_groupgemm", "grouped GEMM", "x:y",
                                                             probe=lambda: "needs CUDA")]),
                name="builtin-rewards", distribution="rlweave", version="0.1.0")
    # the real built-in run modes and rollouts (light records): run.mode resolves through them
    import rlweave.algo_helpers.plugin as builtin_rollouts

    pm.register(builtin_rollouts, name="builtin-rollouts", distribution="rlweave", version="0.1.0")
    return pm


def changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of the config ``base`` with each ``a__b__c=value`` set at ``a.b.c``
    (missing parents created)."""
    data = copy.deepcopy(base)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return data
