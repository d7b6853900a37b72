"""The LoRA settings a training rank receives: the ``roles.<role>.lora`` config section.

Part of the worker contract: :attr:`WorkerContext.lora <rlweave.interfaces.worker.WorkerContext>`
holds one (validated from a dict when a test or embedder passes a mapping) when the role trains
low-rank adapters, else None. A backend that builds adapters says so in its record
(``BackendRecord.lora``); validation refuses the section for any other backend.

With adapters, only the adapter matrices (and the ``modules_to_save`` copies) are trainable and
in the optimizer; the base weights stay as loaded. Weights leave the backend merged
(``W + alpha/r * B @ A``) under the base model's names, so engines and exports see a plain model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: ``target_modules`` value that adapts every linear layer of the decoder (not the LM head)
ALL_LINEAR = "all-linear"


class LoRASection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="Rank of each adapter (the inner size of B @ A).")
    alpha: float = Field(32.0, gt=0, description="Scale numerator: the update is alpha / r * B @ A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input while training.")
    target_modules: list[str] | str = Field(
        ALL_LINEAR, description="Linear layers that get adapters, by module name suffix (e.g. [q_proj, v_proj]), or "
        "'all-linear': every linear layer of the decoder (not the LM head, a value/score head or mixture-of-experts "
        "routers; experts stored as stacked tensors get none).",
    )
    modules_to_save: list[str] = Field(
        default_factory=list, description="Modules trained in full beside the adapters (e.g. [lm_head]); their "
        "weights are checkpointed and synced as well.",
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str) and v != ALL_LINEAR:
            raise ValueError(f"give a list of module names or '{ALL_LINEAR}', not {v!r}")
        if isinstance(v, list) and not v:
            raise ValueError(f"empty: name at least one module, or use '{ALL_LINEAR}'")
        return v
