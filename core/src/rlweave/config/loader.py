"""Load a run config: YAML file + overrides -> validated :class:`RunConfig` + plugins.

``load_config(path, overrides, pm, check_inputs=True)`` reads the YAML (strict: duplicate keys
are errors), applies ``key.path=value`` overrides and validates in three steps, reporting
every problem of all of them in one :class:`~rlweave.config.errors.ConfigError`, each line
``<file>: <dotted.path>: <message>``:

1. pass one: the core sections (strict pydantic models of :mod:`rlweave.config.schema`);
2. pass two: the selected plugins and their own sections (:mod:`rlweave.config.resolve`).
   It runs even when pass one fails: on the config with the invalid parts dropped so their
   defaults apply (:mod:`rlweave.config.repair`). Its issues use the paths of the user's file,
   and an issue at the same path as a pass-one error, or inside or around one, is left out
   as a mere consequence of it;
3. the inputs (:mod:`rlweave.config.inputs`, skipped with ``check_inputs=False``): model
   directories, data files and a dry run of each reward, again skipping what an earlier
   issue already covers.

Nothing heavy (torch, ray, engines) is imported.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import ValidationError

from rlweave.config.errors import ConfigError, ConfigIssue, is_within, issues_from_validation, related
from rlweave.config.inputs import collect_input_issues
from rlweave.config.overrides import apply_overrides
from rlweave.config.repair import Repair
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


def validate_core(data: dict[str, Any], source: str) -> tuple[RunConfig | None, list[ConfigIssue], Repair | None]:
    """Pass one: the core sections.

    Returns ``(cfg, issues, repair)``. Valid: ``(cfg, [], None)``. Invalid: ``cfg`` is the
    config with the invalid parts dropped so their defaults apply (``None`` when that does not
    give a valid config), for pass two to run on; ``repair`` maps its paths back.
    """
    try:
        return RunConfig.model_validate(data), [], None
    except ValidationError as exc:
        repair = Repair(data)
        return repair.run(RunConfig, exc.errors()), issues_from_validation(exc, source, RunConfig), repair


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = (),
                pm: PluginManager | None = None, *, check_inputs: bool = True) -> tuple[RunConfig, ResolvedPlugins]:
    """Read, override and validate a run config (both passes, then the inputs).

    Args:
        path: the YAML file; shown in messages as given.
        overrides: ``key.path=value`` strings, applied in order.
        pm: plugin manager (default: the process-wide one over installed plugins).
        check_inputs: also check what the run reads (:mod:`rlweave.config.inputs`: model
            directories, data files, a dry run of each reward). ``False`` checks the config
            alone, e.g. for a shipped example whose model an earlier stage builds.

    Returns:
        ``(cfg, resolved)``: the config with plugin sections filled with their defaults,
        and the selected records.

    Raises:
        ConfigError: listing every problem of every pass; nothing has been started.
    """
    source = str(path)
    data = read_yaml(path, source)
    issues = apply_overrides(data, overrides)
    cfg, core_issues, repair = validate_core(data, source)
    issues += core_issues
    if cfg is None:
        raise ConfigError(issues)
    if pm is None:
        from rlweave.plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
    original = repair.original if repair is not None else (lambda p: p)
    broken = [i.path for i in core_issues]

    def keep(found: list[ConfigIssue]) -> list[ConfigIssue]:
        """Paths of the original file; drop issues that only echo a pass-one error."""
        mapped = [replace(i, path=original(i.path)) for i in found]
        return [i for i in mapped if not any(related(i.path, b) for b in broken)]

    resolved, plugin_issues = collect_plugin_issues(
        cfg, pm, source, skip=lambda p: any(is_within(original(p), b) for b in broken))
    issues += keep(plugin_issues)
    if check_inputs:
        flagged = broken + [i.path for i in issues]
        issues += keep(collect_input_issues(cfg, resolved, source,
                                            skip=lambda p: any(related(original(p), f) for f in flagged)))
    if issues:
        raise ConfigError(issues)
    return cfg, resolved
