"""Which rollout a run uses (``rollout.name``), and how its settings are found.

The rule lives here once, for validation (:mod:`rlweave.config.resolve`) and for the algorithms'
toolkit that builds the rollout: ``rollout.name`` when set, else ``multi_turn`` when the
algorithm's config has a ``multi_turn`` section (``agent`` when that section names an agent
function), else ``single_turn``. The multi-turn and agent rollouts' settings are
``algorithm.multi_turn``; every other rollout's are ``rollout.args``. Light: no
torch, no toolkit import.
"""

from __future__ import annotations

from typing import Any

#: the rollout of algorithms that sample one continuation per prompt
SINGLE_TURN = "single_turn"
#: the rollout configured by ``algorithm.multi_turn`` with an environment
MULTI_TURN = "multi_turn"
#: the rollout configured by ``algorithm.multi_turn`` with an agent function
AGENT = "agent"
#: the rollouts whose settings are ``algorithm.multi_turn``
FROM_MULTI_TURN = (MULTI_TURN, AGENT)


def rollout_name(run_config: Any, algorithm_config: Any) -> str:
    """The rollout a run uses (see the module docstring); ``run_config`` may be None (tests)."""
    section = getattr(run_config, "rollout", None)
    name = getattr(section, "name", None)
    if name:
        return str(name)
    settings = getattr(algorithm_config, "multi_turn", None)
    if settings is None:
        return SINGLE_TURN
    return AGENT if getattr(settings, "agent", None) is not None else MULTI_TURN


def rollout_args(run_config: Any, algorithm_config: Any) -> Any:
    """The settings a rollout is built with: ``algorithm.multi_turn`` for the multi-turn rollout,
    else ``rollout.args`` (validated by pass two when a run config went through it)."""
    if rollout_name(run_config, algorithm_config) in FROM_MULTI_TURN:
        return getattr(algorithm_config, "multi_turn", None)
    section = getattr(run_config, "rollout", None)
    return dict(getattr(section, "args", None) or {})


def setting_problems(run_config: Any, algorithm_config: Any) -> list[tuple[str, str]]:
    """``(key path, message)`` for settings that contradict the rule: ``rollout.args`` for the
    multi-turn rollout, ``algorithm.multi_turn`` beside another rollout, ``rollout.name:
    multi_turn`` without ``algorithm.multi_turn``."""
    name = rollout_name(run_config, algorithm_config)
    has_mt = getattr(algorithm_config, "multi_turn", None) is not None
    args = getattr(getattr(run_config, "rollout", None), "args", None) or {}
    out: list[tuple[str, str]] = []
    if name in FROM_MULTI_TURN:
        agent = getattr(getattr(algorithm_config, "multi_turn", None), "agent", None)
        if has_mt and (name == AGENT) != (agent is not None):
            out.append(("rollout.name", f"the {name} rollout needs algorithm.multi_turn."
                        f"{'agent' if name == AGENT else 'env'}; remove rollout.name"))
        if not has_mt:
            out.append(("rollout.name", f"the {name} rollout is configured by algorithm.multi_turn (env, max_turns, "
                        "...): set that section"))
        if args:
            out.append(("rollout.args", f"the {name} rollout takes its settings from algorithm.multi_turn; remove "
                        "rollout.args"))
    elif has_mt:
        out.append(("algorithm.multi_turn", f"algorithm.multi_turn configures the multi_turn rollout, but rollout.name "
                    f"is {name!r}: remove one of them"))
    return out
