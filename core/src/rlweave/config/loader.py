"""Load a run config: YAML file + overrides -> validated :class:`RunConfig` + plugins.

``load_config(path, overrides, pm)`` reads the YAML (strict: duplicate keys are errors),
applies ``key.path=value`` overrides, validates the core sections (pass one, strict
pydantic models of :mod:`rlweave.config.schema`) and then the selected plugins and their
own sections (pass two, :mod:`rlweave.config.resolve`). Every problem found is collected
into one :class:`~rlweave.config.errors.ConfigError`, each line
``<file>: <dotted.path>: <message>``. Nothing heavy (torch, ray, engines) is imported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import ValidationError

from rlweave.config.errors import ConfigError, ConfigIssue, issues_from_validation
from rlweave.config.overrides import apply_overrides
from rlweave.config.resolve import ResolvedPlugins, collect_plugin_issues
from rlweave.config.schema import RunConfig
from rlweave.plugins.manager import PluginManager


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}'", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_yaml(path: str | os.PathLike[str], source: str | None = None) -> dict[str, Any]:
    """Read the config file into a dict; raise :class:`ConfigError` if it cannot be read."""
    source = source or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigIssue(source, "", "file not found")]) from None
    except OSError as exc:
        raise ConfigError([ConfigIssue(source, "", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigIssue(source, "", f"invalid YAML{where}: {problem}")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue(source, "", f"the top level must be a mapping of sections, "
                                                   f"got {type(data).__name__}")])
    return data


#: sections pass two reads; if one of them fails pass one, pass two is skipped
PASS_TWO_SECTIONS = frozenset({"required_plugins", "algorithm", "roles", "rewards", "kernels", "resources"})


def validate_core(data: dict[str, Any], source: str) -> tuple[RunConfig | None, RunConfig | None, list[ConfigIssue]]:
    """Pass one: the core sections.

    Returns ``(cfg, partial, issues)``: ``cfg`` when valid; otherwise ``partial`` is the
    config with the failing sections left at their defaults, when none of them is one pass
    two reads (so pass two can still report its own problems in the same message).
    """
    try:
        return RunConfig.model_validate(data), None, []
    except ValidationError as exc:
        issues = issues_from_validation(exc, source, RunConfig)
        failed = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
        if failed & PASS_TWO_SECTIONS:
            return None, None, issues
        try:
            partial = RunConfig.model_validate({k: v for k, v in data.items() if k not in failed})
        except ValidationError:
            partial = None
        return None, partial, issues


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = (),
                pm: PluginManager | None = None) -> tuple[RunConfig, ResolvedPlugins]:
    """Read, override and validate a run config (both passes).

    Args:
        path: the YAML file; shown in messages as given.
        overrides: ``key.path=value`` strings, applied in order.
        pm: plugin manager (default: the process-wide one over installed plugins).

    Returns:
        ``(cfg, resolved)``: the config with plugin sections filled with their defaults,
        and the selected records.

    Raises:
        ConfigError: listing every problem; nothing has been started.
    """
    source = str(path)
    data = read_yaml(path, source)
    issues = apply_overrides(data, overrides)
    cfg, partial, core_issues = validate_core(data, source)
    issues += core_issues
    resolved = ResolvedPlugins()
    if cfg is not None or partial is not None:
        if pm is None:
            from rlweave.plugins.manager import get_plugin_manager

            pm = get_plugin_manager()
        resolved, plugin_issues = collect_plugin_issues(cfg or partial, pm, source)
        issues += plugin_issues
    if issues or cfg is None:  # cfg is None only together with pass-one issues
        raise ConfigError(issues)
    return cfg, resolved
