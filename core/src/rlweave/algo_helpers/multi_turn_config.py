"""``algorithm.multi_turn``: multi-turn rollouts through an environment (light: pydantic only).

Null (the default) keeps the single-turn rollout: one continuation per prompt. Set, each sample
is an episode of :mod:`rlweave.algo_helpers.multi_turn`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EnvSpec(BaseModel):
    """Which environment (plugin kind ``environment``) and its arguments."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="Environment name (rlweave list-plugins shows them): tools, a plugin's, or an "
                      "Environment subclass as module:Class or path/to/file.py:Class.")
    args: dict[str, Any] = Field(default_factory=dict, description="The environment's arguments (its own schema).")

    @model_validator(mode="after")
    def _known(self) -> EnvSpec:
        resolve_environment(self.name, self.args, load=False)  # unknown names and bad arguments raise here
        return self


def resolve_environment(name: str, args: dict[str, Any], load: bool = True) -> tuple[Any, Any]:
    """``(environment class, validated arguments)`` of ``algorithm.multi_turn.env``: a registered
    environment's class and its ``config_model`` instance, or a ``module:Class`` (or
    ``path/to/file.py:Class``) with ``args`` as they are. ``load=False`` checks without importing
    a registered environment's class (the class is then None)."""
    if ":" in name:
        from rlweave.interfaces.environment import Environment
        from rlweave.sandbox.worker import import_reward_target

        cls = import_reward_target(name)
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise ValueError(f"algorithm.multi_turn.env.name {name!r} is not an Environment subclass")
        return cls, dict(args)
    from rlweave.plugins.manager import get_plugin_manager

    record = get_plugin_manager().get("environment", name, where="algorithm.multi_turn.env.name")
    validated = record.config_model.model_validate(args) if record.config_model is not None else dict(args)
    return (record.load() if load else None), validated


class MultiTurnConfig(BaseModel):
    """Episodes of model turns and environment steps (see :mod:`rlweave.algo_helpers.multi_turn`)."""

    model_config = ConfigDict(extra="forbid")

    env: EnvSpec = Field(..., description="The environment each episode runs in.")
    max_turns: int = Field(4, ge=1, description="Model turns per episode at most (the last one ends it).")
    max_total_tokens: int = Field(
        1024, ge=2, description="Tokens of an episode at most (prompt, model turns and observations); a model turn "
        "is cut to fit, an observation that does not fit ends the episode.")
    scheduling: Literal["independent", "lockstep"] = Field(
        "independent", description="independent: an episode whose environment step is done generates next with the "
        "others ready then, while slow steps go on; lockstep: every model turn waits for all environment steps.")
    concurrency: int = Field(8, ge=1, description="Environment steps running at once (threads).")
    engine_calls: int = Field(
        1, ge=1, description="Engine calls in flight at once, made from threads: above 1, episodes that become ready "
        "go to the engine while an earlier call runs, and an engine that batches concurrent calls (vLLM) takes them "
        "into its running batch.")
    max_in_flight: Optional[int] = Field(
        None, ge=1, description="Episodes running at once (the next starts when one ends); null: every episode of "
        "the step starts at once.")
    end_on_length: bool = Field(
        True, description="A model turn cut by max_new_tokens ends the episode; false: the environment steps on it "
        "(a turn cut by max_total_tokens always ends it).")


class MultiTurnKeys(BaseModel):
    """The ``multi_turn`` key of the algorithms that sample through the rollout seam (GRPO, PPO,
    OnlineDPO): their configs subclass this, and :func:`rlweave.algo_helpers.rollout.make_rollout`
    turns it into their rollout."""

    model_config = ConfigDict(extra="forbid")

    multi_turn: Optional[MultiTurnConfig] = Field(
        None, description="Multi-turn episodes through an environment (tools, games...): each sample is an episode "
        "of model turns and environment steps, the loss on the model's tokens only; null: one continuation per prompt."
    )
