"""Command-line overrides: ``key.path=value`` applied to the raw YAML mapping.

* The key is a dotted path of mapping keys and list indices: ``run.total_steps=20``,
  ``rewards.0.weight=2``, ``roles.policy.options.grad_accum=4``.
* The value is parsed as YAML: ``3`` is an int, ``true`` a bool, ``[1, 2]`` a list,
  ``null`` None, ``'3'`` a string; an empty value means null.
* Missing mapping keys are created; a list index must exist.

Problems are returned as :class:`~rlweave.config.errors.ConfigIssue` with source
``command line`` (all of them, not only the first), never raised one by one.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import yaml

from rlweave.config.errors import ConfigIssue

SOURCE = "command line"
_KEY_PART = re.compile(r"^[A-Za-z0-9_\-]+$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"a.b=value"`` into (``["a", "b"]``, parsed value); ValueError says what is wrong."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ValueError("expected key.path=value, e.g. run.total_steps=20")
    if not key:
        raise ValueError("missing key before '=', expected key.path=value")
    parts = key.split(".")
    bad = [p for p in parts if not _KEY_PART.match(p)]
    if bad:
        raise ValueError(f"invalid key path '{key}': each part must be a name or a list index")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ValueError(f"value {raw!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return parts, value


def _set(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[:depth]) or "the config"
        if isinstance(node, list):
            if not part.isdigit():
                raise ValueError(f"{here} is a list: use an index, not '{part}'")
            index = int(part)
            if index >= len(node):
                raise ValueError(f"index {index} is out of range ({here} has {len(node)} entries)")
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        else:
            raise ValueError(f"{here} is a {type(node).__name__}, so it has no key '{part}'")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[ConfigIssue]:
    """Apply each override to ``data`` in place; return the issues of those that failed."""
    issues: list[ConfigIssue] = []
    for text in overrides:
        try:
            parts, value = parse_override(text)
            _set(data, parts, value)
        except ValueError as exc:
            issues.append(ConfigIssue(SOURCE, f"override '{text}'", str(exc)))
    return issues
