"""The reward config sections, beside the code they configure: ``rewards[]`` entries
(:class:`RewardEntry`) and ``reward_runtime`` (:class:`RewardsRuntime`, with its
:class:`RewardSandbox`).

:class:`~rlweave.config.schema.RunConfig` holds them; :class:`~rlweave.rewards.reward_set.RewardSet`
takes them (or plain dicts, validated here). Strict, as every core section: an unknown key is
an error. A reward worker process never imports this module (it needs no pydantic).
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class RewardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(..., description="Reward plugin name, or 'module:function' for a user function.")
    weight: float = Field(1.0, description="Weight in the summed reward.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the function.")


class RewardSandbox(BaseModel):
    """Limits of each reward worker process (``rlweave.sandbox.pool``). They guard against accidents and runaway
    reward code (a huge allocation, an endless loop, a fork bomb, a stray request), not against deliberately
    malicious native code: process and network refusal are Python audit hooks, which C code can bypass. A reward
    that uses CUDA in its worker needs ``memory_mb: null`` (CUDA reserves far more address space than it uses)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    memory_mb: Optional[int] = Field(
        4096, ge=64, description="Address space of each worker in MiB (RLIMIT_AS; BLAS/OpenMP pools default to 1 "
        "thread): a larger allocation fails the call with MemoryError. null: no limit.",
    )
    cpu_s: Optional[float] = Field(
        None, gt=0, description="CPU seconds one call may use (RLIMIT_CPU, rounded up to whole seconds): the call "
        "fails and the worker is kept. null: timeout_s.",
    )
    private_dir: bool = Field(
        True, description="Each worker runs in its own temporary directory (cwd and TMPDIR), removed when it ends; "
        "relative paths in reward code resolve there. false: the run's cwd.",
    )
    network: bool = Field(
        True, description="Reward code may open IP sockets and resolve names (LLM judges, remote code sandboxes). "
        "false: refused with PermissionError.",
    )
    processes: bool = Field(
        False, description="Reward code may start processes (code-execution rewards); what a call leaves running "
        "is killed when it returns. false: refused with PermissionError, so a fork bomb stops at its first fork.",
    )


class RewardsRuntime(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    timeout_s: float = Field(5.0, gt=0, description="Per-call timeout of a reward function.")
    failure_reward: float = Field(0.0, description="Reward given to a sample whose reward call fails.")
    workers: int = Field(2, ge=1, description="Reward worker processes.")
    sandbox: RewardSandbox = Field(default_factory=RewardSandbox, description="Limits of each reward worker process.")
    max_failed_share: float = Field(
        0.5, ge=0, le=1, description="Stop the run (RewardFailureError) when more than this share of one reward's "
        "calls in one scoring (a step's batch, an evaluation) fail: error, timeout, crash. 1.0: never stop.",
    )
