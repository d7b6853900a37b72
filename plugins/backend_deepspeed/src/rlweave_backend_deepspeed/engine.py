"""Starting a DeepSpeed engine on a rank whose process group rlweave already initialised.

:func:`start` wraps a model (and the worker's torch AdamW, when the role trains) in
``deepspeed.initialize`` with the config of :mod:`.ds_json`. On a CPU rank, DeepSpeed's
shared-memory all-reduce (used by its inference kernels only) is marked unavailable first: it
would otherwise be compiled with gcc at the first start on a machine (about a minute), and
the training collectives run over gloo either way.
"""

from __future__ import annotations

from typing import Any

import torch


def _skip_shm_comm() -> None:
    from deepspeed import ops

    # the probed table of compatible ops is cached in the module and read when the comm backend starts
    ops.__compatible_ops__["deepspeed_shm_comm"] = False


def start(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, config: dict[str, Any],
          device: torch.device):
    """``deepspeed.initialize`` on the existing default process group; returns the engine. Without
    ``optimizer`` (a role that only scores) ZeRO-3 still partitions the parameters. DeepSpeed
    requires ``LOCAL_RANK``; a launcher that sets none (a Ray actor) gets the device's index."""
    import logging
    import os

    os.environ.setdefault("LOCAL_RANK", str(device.index or 0))

    if device.type == "cpu":
        _skip_shm_comm()
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    return engine


def is_zero3(engine) -> bool:
    """Whether ``engine`` partitions the parameters (ZeRO stage 3)."""
    return engine is not None and engine.zero_optimization_partition_weights()


def base_optimizer(engine) -> torch.optim.Optimizer | None:
    """The torch optimizer inside the engine's ZeRO optimizer (its parameters are the flat fp32
    partitions this rank updates), or None for a role without one."""
    opt = getattr(engine, "optimizer", None)
    inner = getattr(opt, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else None
