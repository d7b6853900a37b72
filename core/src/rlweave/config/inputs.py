"""Input checks: what a run reads exists and fits, before anything heavy starts.

After both validation passes, :func:`collect_input_issues` looks at the files a run will read,
so that a missing path fails ``rlweave validate`` instead of a worker minutes later:

* model directories: ``model.path`` and ``model.tokenizer``, and ``roles.<r>.model.path`` /
  ``.tokenizer`` of the roles the algorithm uses (every configured role when the algorithm is
  unknown) must be existing local directories, hub names (``org/name``) already in the
  Hugging Face cache at ``model.revision`` (:mod:`rlweave.config.hub`; nothing is downloaded), or
  GGUF files transformers can convert (:func:`rlweave.config.gguf.check_gguf`: header, architecture,
  tensor types);
  ``model.revision`` with a local directory is an error;
* data files: ``data.train`` and ``data.eval`` must exist (jsonl, parquet, or a directory
  written by ``datasets``' ``save_to_disk``), and their first :data:`HEAD` records must be
  well-formed (:mod:`rlweave.data.records`: a bad record is named by file and line or row, and
  field; an empty file is an error too); records in chat form need a chat template
  (``data.chat_template`` or the tokenizer's own); records with images are read, counted and
  measured against a vision-language model, and refused by a text-only one
  (:mod:`rlweave.config.vision_inputs`);
* metrics backends: each selected logger's package must be installed
  (:func:`rlweave.loggers.missing_packages`);
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
from rlweave.config.gguf import GgufError, check_gguf, gguf_file
from rlweave.config.hub import HubModelError, is_hub_name, looks_like_repo_id, model_entries, section_targets
from rlweave.config.hub import resolve as resolve_hub
from rlweave.config.resolve import ResolvedPlugins
from rlweave.config.schema import RunConfig

#: lines read from the top of each data file
HEAD = 16


@dataclass
class DataHead:
    """The first records of one data file: ``records`` holds ``(line or row number, record)``."""

    key: str
    path: str
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    unit: str = "line"  # "line" (jsonl, 1-based) or "row" (parquet, saved datasets; 0-based)

    def where(self, i: int) -> str:
        """``"<path> line 3"`` / ``"<path> row 0"`` of the ``i``-th record read."""
        return f"{self.path} {self.unit} {self.records[i][0]}"


def read_head(path: str, n: int = HEAD) -> tuple[list[tuple[int, dict[str, Any]]], str | None]:
    """Up to ``n`` checked records from the top of a data file (any format of
    :mod:`rlweave.data.formats`) as ``(line or row number, record)``, or the first
    problem found."""
    from rlweave.data.records import DataError, iter_records

    records: list[tuple[int, dict[str, Any]]] = []
    try:
        for location, rec in iter_records(path, limit=n):
            records.append((int(location.split()[-1]), rec))
    except (DataError, FileNotFoundError) as exc:
        return records, str(exc)
    except OSError as exc:
        return records, f"cannot read {path}: {exc.strerror or exc}"
    return records, None if records else f"{path} has no records"


def _model_targets(cfg: RunConfig, resolved: ResolvedPlugins) -> list[tuple[str, str, str | None]]:
    """``(dotted key, path, revision)`` of every model or tokenizer path the run reads."""
    roles = [r for r in resolved.role_names if r in cfg.roles] if resolved.algorithm else list(cfg.roles)
    return [(f"{key}.{name}", value, rev) for key, sec in model_entries(cfg, roles)
            for name, value, rev in section_targets(sec)]


def _gguf_problem(path: str) -> tuple[bool, str | None]:
    """``(names a GGUF, its problem or None)`` for a model or tokenizer path."""
    try:
        found = gguf_file(path)
        if found is None:
            return False, None
        check_gguf(found)
    except GgufError as exc:
        return True, str(exc)
    return True, None


def _check_model_dir(path: str, revision: str | None = None, kind: str = "path") -> str | None:
    p = Path(path)
    is_gguf, problem = _gguf_problem(path)
    if is_gguf:
        return problem
    if not p.exists():
        if looks_like_repo_id(path):
            try:
                resolve_hub(path, revision, kind=kind)
            except HubModelError as exc:
                return str(exc)
            return None
        return f"model directory '{path}' does not exist (a local Hugging Face model directory; nothing is downloaded)"
    if not p.is_dir():
        return f"'{path}' is not a directory (a local Hugging Face model directory or a .gguf file is expected)"
    return None


def _revision_issues(cfg: RunConfig, resolved: ResolvedPlugins) -> list[tuple[str, str]]:
    """``model.revision`` set where ``model.path`` is not a hub name."""
    roles = [r for r in resolved.role_names if r in cfg.roles] if resolved.algorithm else list(cfg.roles)
    out = []
    for key, sec in model_entries(cfg, roles):
        if sec.revision and sec.path and Path(sec.path).exists():
            out.append((f"{key}.revision", f"applies to hub names only; {key}.path '{sec.path}' is a local directory"))
        elif sec.revision and not sec.path:
            out.append((f"{key}.revision", f"needs {key}.path set to a hub name (org/name)"))
    return out


def _tokenizer_dir(cfg: RunConfig) -> str | None:
    """The local directory the run's tokenizer is read from (the policy's model, else ``model``)."""
    role = cfg.roles.get("policy")
    sec = role.model if role is not None and role.model is not None else cfg.model
    value = sec.tokenizer or sec.path
    if not value:
        return None
    if is_hub_name(value):
        try:
            return resolve_hub(value, sec.revision if value == sec.path else None, kind="tokenizer").path
        except HubModelError:
            return None
    return value


def has_chat_template(tokenizer_dir: str) -> bool:
    """Whether a tokenizer directory ships a chat template (read from its files; no transformers)."""
    d = Path(tokenizer_dir)
    if (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file():
        return True
    if (d / "additional_chat_templates").is_dir():
        return True
    try:
        conf = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(isinstance(conf, dict) and conf.get("chat_template"))


def _has_template(tok: str) -> bool:
    """Whether the tokenizer at ``tok`` has a chat template; True when that cannot be told
    (a path the model checks report)."""
    try:
        found = gguf_file(tok)
        if found is not None:
            return check_gguf(found).has_chat_template
    except GgufError:
        return True
    return not Path(tok).is_dir() or has_chat_template(tok)


def _is_jsonl(path: str) -> bool:
    from rlweave.data.formats import detect_format

    return detect_format(path) == "jsonl"


def _chat_problem(cfg: RunConfig, head: DataHead) -> str | None:
    """A chat record among the first ones while no chat template is there to render it."""
    from rlweave.data.records import chat_field

    first = next(((i, f) for i, (_, rec) in enumerate(head.records) if (f := chat_field(rec))), None)
    if first is None or cfg.data.chat_template:
        return None
    tok = _tokenizer_dir(cfg)
    if tok is None or _has_template(tok):
        return None  # no tokenizer to check: the model checks report it
    i, field_name = first
    return (f"{head.where(i)}: field '{field_name}': the tokenizer ({tok}) has no chat template to render chat "
            "messages with: set data.chat_template (a Jinja template, or a .jinja file) or use a tokenizer that has one")


def collect_input_issues(cfg: RunConfig, resolved: ResolvedPlugins, source: str,
                         skip: Callable[[str], bool] = lambda path: False) -> list[ConfigIssue]:
    """Every input problem of a validated (or repaired) config; none raised."""
    issues: list[ConfigIssue] = []

    def issue(key: str, message: str) -> None:
        issues.append(ConfigIssue(source, key, message))

    for key, path, revision in _model_targets(cfg, resolved):
        problem = None if skip(key) else _check_model_dir(path, revision, kind=key.rsplit(".", 1)[-1])
        if problem:
            issue(key, problem)
    for key, message in _revision_issues(cfg, resolved):
        if not skip(key):
            issue(key, message)
    if not skip("logging.backends"):
        from rlweave.loggers import missing_packages

        for hint in missing_packages(list(cfg.logging.backends)).values():
            issue("logging.backends", hint)
    heads: dict[str, DataHead] = {}
    for split in ("train", "eval"):
        key, path = f"data.{split}", getattr(cfg.data, split)
        if not path or skip(key):
            continue
        if not Path(path).exists():
            issue(key, f"data file '{path}' does not exist")
            continue
        records, problem = read_head(path)
        if problem:
            issue(key, problem)
            continue
        head = DataHead(key, path, records, unit="line" if _is_jsonl(path) else "row")
        heads[split] = head
        chat = _chat_problem(cfg, head)
        if chat:
            issue(key, chat)
    if heads:
        from rlweave.config.vision_inputs import vision_issues

        for key, message in vision_issues(cfg, resolved, heads):
            if not skip(key):
                issue(key, message)
    if cfg.rewards and heads:
        from rlweave.config.reward_dryrun import dry_run_rewards

        found = [i.path for i in issues]
        issues += dry_run_rewards(cfg, resolved, heads, source,
                                  lambda path: skip(path) or any(related(path, f) for f in found))
    return issues
