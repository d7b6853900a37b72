"""The optimizer settings a training rank receives: the ``roles.<role>.optim`` config section.

Part of the worker contract: :attr:`WorkerContext.optim <rlweave.interfaces.worker.WorkerContext>`
holds one (validated from a dict when a test or embedder passes a mapping), and
:class:`~rlweave.config.schema.RoleSection` holds it as ``optim``. Strict, as every core
section: an unknown key is an error.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class OptimSection(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(1e-5, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, ge=0, description="Max global grad norm (0: no clipping).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up optimizer steps.")
    schedule: Literal["constant", "cosine"] = Field("constant", description="LR schedule after warm-up.")
    total_steps: Optional[int] = Field(
        None, description="Optimizer steps for the cosine schedule (null: run.total_steps x the algorithm's updates per step)."
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")
