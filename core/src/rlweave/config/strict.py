"""Strict plugin sections: an unknown key is an error, whatever the plugin's model says.

A plugin's config model may be a plain pydantic ``BaseModel`` (pydantic ignores unknown keys
by default) or even allow extra keys; the core still promises that a typo in ``algorithm``,
``roles.<r>.options`` or ``rewards[].args`` is reported. :func:`split_unknown` walks a section
against the model before pydantic sees it and returns the section without its unknown keys
plus one ``(location, message)`` per unknown key, with the same "Did you mean" as the core.

* Nested models are checked too, through ``Optional``, ``list``/``tuple``/``set`` items and
  ``dict[str, Model]`` values. A field that is not a model (``dict[str, Any]``, a union of
  several models, a ``RootModel``) stays free-form.
* A model may name keys of earlier versions in a class attribute ``moved_keys`` (old key ->
  where its setting lives now): such a key gets that hint instead of "unknown key".
* Keys are the ones pydantic accepts: a field's validation alias (every choice of an
  ``AliasChoices``, the first step of an ``AliasPath``), and its name when it has no alias or
  the model validates by name too.
"""

from __future__ import annotations

import types
import typing
from collections import abc
from collections.abc import Sequence
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel
from pydantic.fields import FieldInfo

from rlweave.config.errors import unknown_key_message

Location = tuple[Any, ...]


def _aliases(info: FieldInfo) -> list[str]:
    alias = info.validation_alias if info.validation_alias is not None else info.alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias is not None else []
    out = []
    for choice in choices:
        first = choice.path[0] if isinstance(choice, AliasPath) else choice
        if isinstance(first, str):
            out.append(first)
    return out


def accepted_keys(model: type[BaseModel]) -> dict[str, str]:
    """Keys a mapping may hold for ``model`` -> the field each one sets."""
    config = model.model_config
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    by_alias = config.get("validate_by_alias", True) is not False
    keys: dict[str, str] = {}
    for name, info in model.model_fields.items():
        aliases = _aliases(info)
        if by_alias:
            keys.update(dict.fromkeys(aliases, name))
        if not aliases or by_name or not by_alias:
            keys[name] = name
    return keys


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel) and not getattr(tp, "__pydantic_root_model__", False)


def _strip(tp: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``; ``Optional[X]`` -> ``X``; other unions stay as they are."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _strip(options[0]) if len(options) == 1 else tp
    return tp


def _item_type(tp: Any, index: int) -> Any:
    """The annotation of item ``index`` of a sequence annotation (``Any`` when unknown)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return args[index] if index < len(args) else Any
    return args[0] if args else Any


_SEQUENCES = (list, tuple, set, frozenset, abc.Sequence, abc.MutableSequence, abc.Set, abc.MutableSet)
_MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)


def _descend(tp: Any, value: Any, loc: Location) -> tuple[Any, list[tuple[Location, str]]]:
    tp = _strip(tp)
    if _is_model(tp):
        return split_unknown(tp, value, loc)
    origin = typing.get_origin(tp)
    found: list[tuple[Location, str]] = []
    if origin in _SEQUENCES and isinstance(value, list):
        items = []
        for i, item in enumerate(value):
            clean, inner = _descend(_item_type(tp, i), item, loc + (i,))
            items.append(clean)
            found += inner
        return items, found
    if origin in _MAPPINGS and isinstance(value, dict) and len(typing.get_args(tp)) == 2:
        values = {}
        for key, item in value.items():
            values[key], inner = _descend(typing.get_args(tp)[1], item, loc + (key,))
            found += inner
        return values, found
    return value, found


def split_unknown(model: type[BaseModel], data: Any,
                  loc: Location = ()) -> tuple[Any, list[tuple[Location, str]]]:
    """``(data without unknown keys, [(location, message), ...])`` for ``data`` read as ``model``.

    ``data`` that is not a mapping is returned unchanged (pydantic reports its type). Locations
    are relative to ``data`` (prefixed with ``loc``), in the order the keys appear.
    """
    if not isinstance(data, dict) or not _is_model(model):
        return data, []
    keys = accepted_keys(model)
    allowed: Sequence[str] = list(keys)
    clean: dict[Any, Any] = {}
    found: list[tuple[Location, str]] = []
    for key, value in data.items():
        field = keys.get(key) if isinstance(key, str) else None
        if field is None:
            moved = getattr(model, "moved_keys", {}).get(key) if isinstance(key, str) else None
            found.append((loc + (key,), f"no longer a key here: {moved}" if moved
                          else unknown_key_message(str(key), allowed)))
            continue
        clean[key], inner = _descend(model.model_fields[field].annotation, value, loc + (key,))
        found += inner
    return clean, found


def validate_section(model: type[BaseModel], data: Any, path: str) -> tuple[BaseModel | None, list[tuple[str, str]]]:
    """A plugin's own section ``data`` at dotted ``path`` read strictly as ``model``:
    ``(the validated model or None, [(dotted key, message), ...])``, every unknown key and every
    invalid value at its full key (``algorithm.multi_turn.env.args.max_tool_calls``)."""
    from pydantic import ValidationError

    from rlweave.config.errors import dotted, issues_from_validation

    clean, unknown = split_unknown(model, data)
    parsed, problems = None, []
    try:
        parsed = model.model_validate(clean)
    except ValidationError as exc:
        problems = [(i.path, i.message) for i in issues_from_validation(exc, "", model, path.split("."))]
    return parsed, problems + [(f"{path}.{dotted(loc)}", message) for loc, message in unknown]
