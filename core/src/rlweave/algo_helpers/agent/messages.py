"""Chat messages of the OpenAI schema, as the endpoint compares and renders them.

A request extends an episode's sample when its messages start with the messages of the sample's
last request followed by the assistant reply the endpoint gave (compared by :func:`same`: role,
text, tool calls by name and parsed arguments, tool call id, name), so the client's own
serialisation of a reply (``None`` or ``""`` content, argument JSON spacing) does not matter.
"""

from __future__ import annotations

import json
import re
from typing import Any


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, ``None`` (``""``) or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        out.append((fn.get("name"), _arguments(fn.get("arguments"))))
    return out


def key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a message for :func:`same`."""
    return (message.get("role"), text_of(message.get("content")), _calls(message), message.get("tool_call_id"),
            message.get("name"))


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return key(a) == key(b)


def for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as chat templates read them: text content, tool call arguments as objects,
    no ``None`` fields."""
    out = []
    for m in messages:
        msg = {k: v for k, v in m.items() if v is not None}
        msg["content"] = text_of(m.get("content"))
        if m.get("tool_calls"):
            msg["tool_calls"] = [{"type": "function", "id": c.get("id"),
                                  "function": {"name": (c.get("function") or {}).get("name"),
                                               "arguments": _arguments((c.get("function") or {}).get("arguments"))}}
                                 for c in m["tool_calls"]]
        out.append(msg)
    return out


_HERMES_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


def reply(text: str, parse: Any, call_id: str) -> dict[str, Any]:
    """The assistant message of a model turn's ``text``: with a tool-call parser (``parse``, None
    when the request has no tools or ``tool_choice: none``) its well-formed calls become
    ``tool_calls`` (ids ``f"{call_id}_{i}"``) and ``content`` is the text outside ``<tool_call>``
    blocks (None when empty); a turn whose calls are all malformed is returned as plain text."""
    if parse is None:
        return {"role": "assistant", "content": text}
    calls, _ = parse(text)
    if not calls:
        return {"role": "assistant", "content": text}
    content = _HERMES_BLOCK.sub("", text).strip() or None
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"{call_id}_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        for i, c in enumerate(calls)]}
