"""Tool-call parsers: from a model turn's text to the tool calls it asks for.

A parser is ``fn(text) -> (calls, problems)``: ``calls`` a list of :class:`ToolCall`, ``problems``
one message per malformed call (returned to the model as an error observation). Parsers are a
plugin kind (``tool_parser``, hook ``rlweave_tool_parsers``, listed by ``rlweave list-plugins``)
chosen by name in ``env.args.parser``, or given as ``module:function`` (a function attribute
``call_format`` then tells the system message how a call is written).

``hermes`` (Hermes / Qwen2.5 / Qwen3 function calling): each call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the arguments may also be a JSON
string holding the object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def hermes(text: str) -> tuple[list[ToolCall], list[str]]:
    """The ``<tool_call>`` JSON blocks of ``text`` (see the module docstring)."""
    calls: list[ToolCall] = []
    problems: list[str] = []
    for m in _HERMES.finditer(text):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            problems.append(f"tool call is not valid JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            problems.append(f"tool call needs a JSON object with a string 'name': {body[:80]!r}")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                problems.append(f"arguments of tool {obj['name']!r} are not a JSON object: {args[:80]!r}")
                continue
        if not isinstance(args, dict):
            problems.append(f"arguments of tool {obj['name']!r} must be a JSON object, got {type(args).__name__}")
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls, problems


Parser = Callable[[str], tuple[list[ToolCall], list[str]]]


def resolve_parser(name: str, load: bool = True) -> tuple[Parser | None, str]:
    """``(parser function, call format)`` of ``name``: a registered parser (plugin kind
    ``tool_parser``) or a ``module:function`` / ``path/to/file.py:function``. ``load=False`` checks
    a registered name without importing its function (which is then None). An unknown name raises
    the plugin manager's ``LookupError`` naming the parsers there are; a reference that names
    nothing usable, :class:`~rlweave.targets.TargetError` (a ``ValueError``) saying why."""
    if ":" in name:
        from rlweave.plugins.references import user_function

        fn = user_function(name, "tool parser")
        return fn, str(getattr(fn, "call_format", ""))
    from rlweave.plugins.manager import get_plugin_manager

    record = get_plugin_manager().get("tool_parser", name)
    return (record.load() if load else None), record.call_format
