"""Contract of an algorithm plugin: the dataflow of one training step.

The core runner owns the loop (data loading, progress, metrics files, evaluation schedule,
checkpoints, resume). The algorithm owns what happens inside a step, expressed as calls on
role handles (``ctx.roles['policy'].train(...)``, ``ctx.roles['rollout'].generate(...)``),
which dispatch to every rank and return futures, so independent calls overlap.

Lifecycle, all on the controller process:
``__init__(config, ctx)`` -> ``setup()`` (roles are built and reachable) ->
``step(records)`` once per step -> ``evaluate(records)`` on the schedule ->
``state_dict()`` at each checkpoint / ``load_state_dict()`` on resume. ``drain()`` before
each evaluation and checkpoint, at the end of the run, and (``abort=True``) when it fails.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.weight_sync.service import WeightSync


@dataclass
class RunContext:
    """What the runner hands an algorithm.

    ``roles``: role name -> role handle (see ``rlweave.scheduler.RoleHandle``).
    ``tokenizer``: the run's Hugging Face tokenizer. ``rewards``: the configured reward
    set (``rlweave.rewards.RewardSet``) or None. ``run_dir``: this run's directory.
    ``config``: the whole validated run config. ``seed``: the run seed.
    ``weight_sync``: the run's weight syncs between roles
    (:class:`rlweave.weight_sync.WeightSync`; default: one over ``roles`` with the default
    ``weight_sync`` section). ``next_records``: returns the next batch of training records
    (algorithms that need more prompts in a step), or None when there is no training data.
    ``vision``: the run's :class:`~rlweave.data.vision.VisionProcessor` when the model is a
    vision-language model (it turns records with ``images`` into prompts), else None.
    """

    roles: dict[str, Any]
    tokenizer: Any
    run_dir: Path
    config: Any
    rewards: Any = None
    seed: int = 0
    weight_sync: "WeightSync" = None  # type: ignore[assignment] - filled in by __post_init__
    next_records: Callable[[], list[dict[str, Any]]] | None = None
    vision: Any = None

    def __post_init__(self) -> None:
        if self.weight_sync is None:
            from rlweave.weight_sync.service import WeightSync

            section = getattr(self.config, "weight_sync", None)
            self.weight_sync = WeightSync(self.roles, section)


class Algorithm(ABC):
    """One post-training algorithm. ``records`` are the raw data records (dicts read
    from jsonl, each with a stable ``id``) of one step's batch.

    An algorithm named by import path (``algorithm.name: my_module:MyAlgorithm``, no plugin:
    :mod:`rlweave.plugins.user_algorithm`) says itself what a plugin's record would:
    ``config_model`` and :meth:`required_roles`; plugin algorithms leave both to their record."""

    #: ``run.mode`` values and whether ``rollout.partial`` is implemented (an algorithm named by
    #: import path; plugin algorithms say it in their record)
    run_modes: ClassVar[tuple[str, ...]] = ("sync",)
    partial_rollout: ClassVar[bool] = False
    #: whether it samples through the rollout seam, so ``rollout.name``/``rollout.args`` apply (an
    #: algorithm named by import path; plugin algorithms say it in their record)
    uses_rollout: ClassVar[bool] = False

    #: pydantic model of the keys beside ``algorithm.name`` (an algorithm named by import path);
    #: ``None``: it takes none and ``__init__`` receives the ``algorithm`` section itself
    config_model: ClassVar[Any] = None

    @classmethod
    def required_roles(cls, config: Any) -> tuple[str, ...]:
        """Roles an algorithm named by import path needs, given its validated config (checked,
        with their placement, before any worker starts). Default: ``("policy", "rollout")``."""
        return ("policy", "rollout")

    def __init__(self, config: Any, ctx: RunContext):
        self.config = config
        self.ctx = ctx

    @classmethod
    def optimizer_steps_per_step(cls, config: Any, role: str) -> int:
        """Optimizer updates ``role`` makes in one run step. The runner multiplies it by
        ``run.total_steps`` for a trained role whose ``optim.total_steps`` is null (the length
        of a cosine schedule). Default: ``ppo_epochs x mini_batches`` where the algorithm's
        config has those fields, else 1; override when an algorithm updates otherwise."""
        return int(getattr(config, "ppo_epochs", 1) or 1) * int(getattr(config, "mini_batches", 1) or 1)

    def setup(self) -> None:
        """Called once after the roles are built (e.g. first weight sync)."""

    @abstractmethod
    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Run one training step on ``records``; return scalar metrics for the logs."""

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Held-out metrics (e.g. exact-match accuracy); never trains."""
        return {}

    def drain(self, abort: bool = False) -> None:
        """Finish what earlier steps left running (a weight sync begun at the last step,
        generate requests in flight) and raise its error: the runner calls it before each
        evaluation and checkpoint and at the end of the run, so these see every update
        landed and an error in the last sync fails the run with its cause. ``abort``: the run
        is failing; stop generation in flight first instead of waiting for it. Default:
        nothing (an algorithm that leaves nothing running)."""

    def close(self) -> None:
        """Release what the algorithm started itself (environment threads and tool workers):
        the runner calls it once at the end of the run, failed or not. Default: nothing."""

    def state_dict(self) -> dict[str, Any]:
        """Algorithm state to checkpoint (KL controller, counters...), JSON-able."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
