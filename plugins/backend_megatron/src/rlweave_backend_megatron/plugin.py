"""Entry point ``megatron``: registers the megatron-core training backend (light: no torch,
no megatron import)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rlweave.plugins.hookspecs import hookimpl
from rlweave.plugins.types import BackendRecord

from rlweave_backend_megatron.checks import check_role
from rlweave_backend_megatron.config import MegatronConfig

MISSING = ("megatron-core is not installed: pip install 'rlweave-backend-megatron[megatron]' "
           "(or megatron-core==0.16.1)")


def megatron_core_installed() -> bool:
    """Whether ``megatron.core`` can be imported, found without importing anything: ``megatron``
    is a namespace package, so ``find_spec("megatron.core")`` would import it; this looks for
    the ``core`` package in its search locations instead."""
    spec = importlib.util.find_spec("megatron")
    locations = getattr(spec, "submodule_search_locations", None) or ()
    return any((Path(loc) / "core" / "__init__.py").is_file() for loc in locations)


def probe() -> str | None:
    """None when megatron-core is importable, else how to install it."""
    return None if megatron_core_installed() else MISSING


@hookimpl
def rlweave_training_backends():
    return [
        BackendRecord(
            name="megatron",
            summary="megatron-core GPTModel with tensor/pipeline/data/expert parallelism (gloo on CPU, NCCL on GPU)",
            target="rlweave_backend_megatron.worker:MegatronWorker",
            config_model=MegatronConfig,
            model_types=("causal_lm", "value", "reward"),
            parallel=("dp", "tp", "pp", "ep"),
            kernels=("moe_groupgemm",),
            router_replay=True,  # replays and records MoE routing (.replay)
            check=check_role,
            probe=probe,
        )
    ]
