"""Input checks: what a run reads exists and fits, before anything heavy starts.

After both validation passes, :func:`collect_input_issues` looks at the files a run will read,
so that a missing path fails ``rlweave validate`` instead of a worker minutes later:

* model directories: ``model.path`` and ``model.tokenizer``, and ``roles.<r>.model.path`` /
  ``.tokenizer`` of the roles the algorithm uses (every configured role when the algorithm is
  unknown) must be existing local directories; nothing is downloaded from a hub;
* data files: ``data.train`` and ``data.eval`` must exist, and their first :data:`HEAD`
  non-blank lines must be JSON objects (a bad line is named by file and line; an empty file
  is an error too);
* a user reward given as ``path/file.py:function`` must name an existing file;
* rewards: each one is dry-run on the first record of the data it scores
  (:mod:`rlweave.config.reward_dryrun`).

Relative paths are taken from the current directory, as the runner takes them. Every problem
is a :class:`~rlweave.config.errors.ConfigIssue` at its dotted key; ``skip(path)`` leaves out
keys an earlier issue already covers. Imports no torch or ray.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlweave.config.errors import ConfigIssue, related
from rlweave.config.resolve import ResolvedPlugins
from rlweave.config.schema import RunConfig

#: lines read from the top of each data file
HEAD = 16


@dataclass
class DataHead:
    """The first records of one data file: ``records`` holds ``(line number, record)``."""

    key: str
    path: str
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def read_head(path: str, n: int = HEAD) -> tuple[list[tuple[int, dict[str, Any]]], str | None]:
    """Up to ``n`` records from the top of a jsonl file, or the first problem found."""
    records: list[tuple[int, dict[str, Any]]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if len(records) >= n:
                    break
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    return records, f"{path} line {lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                if not isinstance(rec, dict):
                    return records, f"{path} line {lineno}: expected a JSON object, got {type(rec).__name__}"
                records.append((lineno, rec))
    except UnicodeDecodeError as exc:
        return records, f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}"
    except OSError as exc:
        return records, f"cannot read {path}: {exc.strerror or exc}"
    return records, None if records else f"{path} has no records"


def _model_keys(cfg: RunConfig, resolved: ResolvedPlugins) -> list[tuple[str, str]]:
    """``(dotted key, path)`` of every model directory the run reads."""
    roles = [r for r in resolved.role_names if r in cfg.roles] if resolved.algorithm else list(cfg.roles)
    sections = [("model", cfg.model)] + [(f"roles.{r}.model", cfg.roles[r].model) for r in roles]
    return [(f"{key}.{name}", value) for key, sec in sections if sec is not None
            for name in ("path", "tokenizer") if (value := getattr(sec, name))]


def _check_model_dir(path: str) -> str | None:
    p = Path(path)
    if not p.exists():
        return f"model directory '{path}' does not exist (a local Hugging Face model directory; nothing is downloaded)"
    if not p.is_dir():
        return f"'{path}' is not a directory (a local Hugging Face model directory is expected)"
    return None


def _reward_files(cfg: RunConfig) -> list[tuple[str, str]]:
    out = []
    for i, entry in enumerate(cfg.rewards):
        module, sep, _ = entry.name.partition(":")
        if sep and module.endswith(".py"):
            out.append((f"rewards.{i}.name", module))
    return out


def collect_input_issues(cfg: RunConfig, resolved: ResolvedPlugins, source: str,
                         skip: Callable[[str], bool] = lambda path: False) -> list[ConfigIssue]:
    """Every input problem of a validated (or repaired) config; none raised."""
    issues: list[ConfigIssue] = []

    def issue(key: str, message: str) -> None:
        issues.append(ConfigIssue(source, key, message))

    for key, path in _model_keys(cfg, resolved):
        problem = None if skip(key) else _check_model_dir(path)
        if problem:
            issue(key, problem)
    for key, path in _reward_files(cfg):
        if not skip(key) and not Path(path).is_file():
            issue(key, f"reward file '{path}' does not exist")
    heads: dict[str, DataHead] = {}
    for split in ("train", "eval"):
        key, path = f"data.{split}", getattr(cfg.data, split)
        if not path or skip(key):
            continue
        if not Path(path).is_file():
            issue(key, f"data file '{path}' does not exist" if not Path(path).exists() else f"'{path}' is not a file")
            continue
        records, problem = read_head(path)
        if problem:
            issue(key, problem)
        else:
            heads[split] = DataHead(key, path, records)
    if cfg.rewards and heads:
        from rlweave.config.reward_dryrun import dry_run_rewards

        found = [i.path for i in issues]
        issues += dry_run_rewards(cfg, resolved, heads, source,
                                  lambda path: skip(path) or any(related(path, f) for f in found))
    return issues
