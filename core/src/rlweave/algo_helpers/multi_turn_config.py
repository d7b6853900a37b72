"""``algorithm.multi_turn``: multi-turn rollouts through an environment (light: pydantic only).

Null (the default) keeps the single-turn rollout: one continuation per prompt. Set, each sample
is an episode of :mod:`rlweave.algo_helpers.multi_turn`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlweave.algo_helpers.agent_config import AgentSpec


#: where the environment of a multi-turn run is named
ENV_KEY = "algorithm.multi_turn.env"


class EnvSpec(BaseModel):
    """Which environment (plugin kind ``environment``) and its arguments; both are checked by
    :func:`check_multi_turn` (validation's pass two), where each problem gets its full key."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="Environment name (rlweave list-plugins shows them): tools, a plugin's, or an "
                      "Environment subclass as module:Class or path/to/file.py:Class.")
    args: dict[str, Any] = Field(default_factory=dict, description="The environment's arguments (its own schema).")


def _environment_classes(module: Any) -> list[str]:
    import inspect

    from rlweave.interfaces.environment import Environment

    return sorted(k for k, v in vars(module).items()
                  if inspect.isclass(v) and issubclass(v, Environment) and not inspect.isabstract(v))


def _environment_problem(obj: Any) -> str | None:
    import inspect

    from rlweave.interfaces.environment import Environment

    if not (inspect.isclass(obj) and issubclass(obj, Environment)):
        return "is not a subclass of rlweave.interfaces.environment.Environment"
    if inspect.isabstract(obj):
        return f"does not implement {', '.join(f'{m}()' for m in sorted(obj.__abstractmethods__))}"
    return None


def environment_kind() -> Any:
    """What an environment reference (``module:Class``, ``path/to/file.py:Class``) must name."""
    from rlweave.plugins.references import reference_kind

    return reference_kind("environment", what="Class", members=_environment_classes,
                          members_label="Environment subclasses", check=_environment_problem)


def environment_record(name: str, pm: Any = None) -> Any:
    """The environment ``name`` selects: a registered one's record, or for a reference
    (``module:Class``, ``path/to/file.py:Class``) its class. Raises ``LookupError`` (an unknown
    name: the plugin manager's message with the choices) or
    :class:`~rlweave.targets.TargetError` (a reference that names nothing usable)."""
    from rlweave.targets import import_reference, is_reference

    if is_reference(name):
        return import_reference(name, environment_kind())[0]
    if pm is None:
        from rlweave.plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
    return pm.get("environment", name)


def resolve_environment(name: str, args: dict[str, Any], load: bool = True, pm: Any = None) -> tuple[Any, Any]:
    """``(environment class, validated arguments)`` of ``algorithm.multi_turn.env``: a registered
    environment's class and its ``config_model`` instance, or a ``module:Class`` (or
    ``path/to/file.py:Class``) with ``args`` as they are. ``load=False`` checks without importing
    a registered environment's class (the class is then None). Raises as
    :func:`environment_record` does, or pydantic's ``ValidationError`` for bad arguments."""
    found = environment_record(name, pm)
    if isinstance(found, type):
        return found, dict(args)
    validated = found.config_model.model_validate(args) if found.config_model is not None else dict(args)
    return (found.load() if load else None), validated


def check_multi_turn(run_config: Any, settings: Any, pm: Any = None) -> list[tuple[str, str]]:
    """``(key path, message)`` for each problem of ``algorithm.multi_turn`` (``settings``, a
    :class:`MultiTurnConfig`): an environment name that is unknown or a reference that names
    nothing usable (at ``...env.name``), and every unknown key or invalid value of ``env.args``
    read as the environment's ``config_model`` (at its own key below ``...env.args``: the tools'
    targets and the parser of the ``tools`` environment among them). The multi-turn rollout's
    ``check`` (:class:`~rlweave.plugins.types.RolloutRecord`)."""
    from rlweave.config.strict import validate_section
    from rlweave.plugins.errors import PluginError
    from rlweave.targets import TargetError

    env = settings.env
    if env is None:
        return []  # an agent run: the agent rollout checks it
    try:
        found = environment_record(env.name, pm)
    except (PluginError, TargetError) as exc:
        return [(f"{ENV_KEY}.name", str(exc))]
    if isinstance(found, type):
        return []  # a user's class takes env.args as they are
    if found.config_model is None:
        return [(f"{ENV_KEY}.args.{key}", f"unknown key: environment '{env.name}' takes no arguments")
                for key in env.args]
    return validate_section(found.config_model, dict(env.args), f"{ENV_KEY}.args")[1]


class MultiTurnConfig(BaseModel):
    """Episodes of model turns and environment steps (see :mod:`rlweave.algo_helpers.multi_turn`), or
    episodes run by an agent function through an OpenAI-compatible endpoint (``agent``, see
    :mod:`rlweave.algo_helpers.agent`): exactly one of ``env`` and ``agent``."""

    model_config = ConfigDict(extra="forbid")

    env: Optional[EnvSpec] = Field(None, description="The environment each episode runs in (or agent).")
    agent: Optional[AgentSpec] = Field(
        None, description="An agent function (module:function) that runs each episode through an OpenAI-compatible "
        "endpoint over the rollout engine (or env).")
    max_turns: int = Field(4, ge=1, description="Model turns per episode at most (the last one ends it; an agent's "
                           "requests past it are refused).")
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
    reward_overlap: bool = Field(
        True, description="Score a record's episodes with the rule rewards and the reward models as soon as they all "
        "ended, while others still generate (one set of calls at a time; reward models only when their roles stay "
        "resident during generation); the rewards are those of scoring the batch at once. Not with rollout.partial.")

    @model_validator(mode="after")
    def _env_or_agent(self) -> "MultiTurnConfig":
        if (self.env is None) == (self.agent is None):
            raise ValueError("set exactly one of env (an environment) and agent (an agent function)")
        return self


class MultiTurnKeys(BaseModel):
    """The ``multi_turn`` key of the algorithms that sample through the rollout seam (GRPO, PPO,
    OnlineDPO): their configs subclass this, and :func:`rlweave.algo_helpers.rollout.make_rollout`
    turns it into their rollout."""

    model_config = ConfigDict(extra="forbid")

    multi_turn: Optional[MultiTurnConfig] = Field(
        None, description="Multi-turn episodes through an environment (tools, games...): each sample is an episode "
        "of model turns and environment steps, the loss on the model's tokens only; null: one continuation per prompt."
    )
