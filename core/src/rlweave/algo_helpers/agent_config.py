"""``algorithm.multi_turn.agent``: episodes run by the user's own agent function through an
OpenAI-compatible endpoint (light: pydantic only; see :mod:`rlweave.algo_helpers.agent`).

``agent: my_agent.py:solve`` is short for ``agent: {target: my_agent.py:solve}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: where the agent of a multi-turn run is named
AGENT_KEY = "algorithm.multi_turn.agent"


class AgentSpec(BaseModel):
    """The agent function and how its episodes are run; checked by :func:`check_agent`."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(..., description="The agent, module:function or path/to/file.py:function: called once per "
                        "episode with an AgentEpisode (OpenAI clients pointed at the episode, the record); returns the "
                        "episode's reward or None (the configured rewards score the final answer).")
    timeout_s: float = Field(300.0, gt=0, description="Limit of one episode's own time: wall-clock seconds less "
                             "those during which one of its requests was queued for or in the engine (a busy engine "
                             "never times an episode out); past it the episode ends as an error and its later "
                             "requests are refused.")
    on_error: Literal["exclude", "zero"] = Field(
        "exclude", description="An episode whose agent raised or timed out: exclude (its tokens get no loss) or zero "
        "(trained with reward 0).")
    parser: str = Field("hermes", description="Tool-call parser that turns the model's text into tool_calls when a "
                        "request lists tools (rlweave list-plugins shows them): hermes, a plugin's, or module:function.")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        return {"target": value} if isinstance(value, str) else value


def agent_kind() -> Any:
    """What an agent reference must name: a function."""
    from rlweave.plugins.references import reference_kind

    return reference_kind("agent")


def check_agent(run_config: Any, settings: Any, pm: Any = None) -> list[tuple[str, str]]:
    """``(key path, message)`` for each problem of an agent run's ``algorithm.multi_turn``: an agent
    target that names no importable function (at ``...agent.target``), a tool-call parser that is
    unknown (at ``...agent.parser``), or the endpoint's packages not installed (at ``...agent``).
    The agent rollout's ``check`` (:class:`~rlweave.plugins.types.RolloutRecord`)."""
    from rlweave.deps import MissingDependency, check_installed
    from rlweave.targets import TargetError, import_reference

    spec = settings.agent
    out: list[tuple[str, str]] = []
    try:
        import_reference(spec.target, agent_kind())
    except TargetError as exc:
        out.append((f"{AGENT_KEY}.target", str(exc)))
    try:
        from rlweave.environments.parsers import resolve_parser

        resolve_parser(spec.parser, load=False)
    except (LookupError, ValueError) as exc:
        out.append((f"{AGENT_KEY}.parser", str(exc)))
    try:
        check_installed(["fastapi", "uvicorn", "openai"])
    except MissingDependency as exc:
        out.append((AGENT_KEY, str(exc)))
    return out
