"""Config errors: every problem found is collected, then raised once.

Each problem is a :class:`ConfigIssue` ``(source, path, message)`` printed as
``<source>: <dotted.path>: <message>``, where ``source`` is the config file as the user
named it (or ``command line`` for an override) and ``path`` uses dots and list indices
(``rewards.0.weight``), the same syntax as overrides.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: where it is and what is wrong."""

    source: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.message}" if self.path else f"{self.source}: {self.message}"


class ConfigError(ValueError):
    """The config is invalid; ``issues`` lists every problem found (never empty).

    Its message is one line for one problem (``invalid config: <file>: <path>: <message>``), else
    a head line counting them and one indented line per problem."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        n = len(self.issues)
        if n == 1:
            super().__init__(f"invalid config: {self.issues[0]}")
            return
        head = f"invalid config ({n} error{'s' if n != 1 else ''}):"
        super().__init__("\n".join([head] + [f"  {i}" for i in self.issues]))


def dotted(loc: Iterable[Any]) -> str:
    """``("rewards", 0, "weight")`` -> ``"rewards.0.weight"``."""
    return ".".join(str(p) for p in loc)


def _inner_model(tp: Any) -> Any:
    """Strip Optional/containers one level: what a field of this annotation holds."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _inner_model(args[0]) if len(args) == 1 else None
    return tp


def _parent_model(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class whose field set contains ``loc[-1]`` (or None when unknown)."""
    current: Any = model
    i = 0
    parts = list(loc[:-1])
    while i < len(parts):
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(parts[i]))
        if field is None:
            return None
        tp = _inner_model(field.annotation)
        i += 1
        if typing.get_origin(tp) in (dict, list):
            tp = _inner_model(typing.get_args(tp)[-1])
            i += 1  # skip the key / index
        current = tp
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def unknown_key_message(key: str, allowed: Sequence[str]) -> str:
    """``unknown key. Did you mean 'x'?`` or ``unknown key (allowed: a, b)``."""
    close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
    return f"unknown key. Did you mean '{close[0]}'?" if close else f"unknown key (allowed: {', '.join(allowed)})"


def is_within(path: str, other: str) -> bool:
    """Whether dotted ``path`` is ``other`` or lies inside it (``rewards.0.name`` in ``rewards.0``)."""
    return path == other or path.startswith(other + ".")


def related(path: str, other: str) -> bool:
    """Whether two dotted paths are the same or one lies inside the other."""
    return is_within(path, other) or is_within(other, path)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def issues_from_validation(exc: ValidationError, source: str, model: type[BaseModel] | None = None,
                           prefix: Sequence[Any] = ()) -> list[ConfigIssue]:
    """Turn a pydantic error into issues; unknown keys get a "did you mean" from ``model``."""
    issues = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = dotted(tuple(prefix) + loc)
        if err["type"] == "extra_forbidden":
            parent = _parent_model(model, loc) if model is not None else None
            message = unknown_key_message(str(loc[-1]), list(parent.model_fields)) \
                if parent is not None else "unknown key"
        elif err["type"] == "missing":
            message = "required key is missing"
        else:
            message = err["msg"]
            if err["type"] == "value_error" and message.startswith("Value error, "):
                message = message[len("Value error, "):]
            elif err["type"] == "assertion_error" and message.startswith("Assertion failed, "):
                message = message[len("Assertion failed, "):]
            if "input" in err and not isinstance(err["input"], (dict, list)) and str(err["input"]) not in message:
                message += f" (got {_short(err['input'])})"
        issues.append(ConfigIssue(source, path, message))
    return issues
