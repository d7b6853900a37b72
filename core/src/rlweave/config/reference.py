"""The configuration reference, drawn from the config models so it cannot drift from them.

:func:`model_rows` walks a pydantic model: one :class:`Row` per key (its dotted path, type,
default and description), into nested sections, ``<name>`` for the keys of a mapping of
sections (``roles.<name>.devices``) and ``[i]`` for the items of a list of sections
(``rewards[i].name``). :func:`reference_markdown` renders the core's :class:`RunConfig` and the
own sections of every installed plugin that has one (an algorithm's keys under ``algorithm.``,
a backend's or engine's under ``roles.<name>.options.``, an estimator's, a rollout's...), which
``scripts/config_reference.py`` writes to ``docs/reference/config.md``. Imports pydantic only.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable

from pydantic import BaseModel, RootModel


@dataclass(frozen=True)
class Row:
    """One key: ``key`` (dotted path), ``type``, ``default`` (as YAML would show it; ``required``
    when there is none) and ``description``."""

    key: str
    type: str
    default: str
    description: str


def _models_in(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """``(suffix, model)`` for a section type inside ``annotation``: ``""`` (the model itself or
    an optional one), ``".<name>"`` (a mapping of them), ``"[i]"`` (a list of them)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, RootModel):
        return []  # a value of its own shape (a name or a mapping), described by its field
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin in (typing.Union, types.UnionType):
        return [m for a in args if a is not type(None) for m in _models_in(a)]
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin in (dict, typing.Mapping) and len(args) == 2:
        return [(".<name>" + s, m) for s, m in _models_in(args[1])]
    if origin in (list, tuple, typing.Sequence) and args:
        return [("[i]" + s, m) for s, m in _models_in(args[0])]
    return []


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, RootModel):
        inner = annotation.model_fields["root"].annotation
        return _type_name(inner)
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    text = re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*)", "", text)  # typing.X, rlweave.a.b.C -> X, C
    return text.replace("NoneType", "None").replace("|", " or ").replace("  ", " ")


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    try:
        value = field.get_default(call_default_factory=True, validated_data={})
    except (TypeError, KeyError):  # a factory that needs other fields' values
        return "(computed)"
    if isinstance(value, RootModel):
        value = value.root
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def model_rows(model: type[BaseModel], prefix: str = "", seen: tuple[type, ...] = ()) -> list[Row]:
    """Every key of ``model`` under ``prefix`` (see the module docstring), sections before their
    keys, in the model's order; a model nested in itself is listed once."""
    rows: list[Row] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        rows.append(Row(key, _type_name(field.annotation), _default(field), " ".join((field.description or "").split())))
        for suffix, sub in _models_in(field.annotation):
            if sub in seen:
                continue
            if suffix:  # an entry of a mapping or list of sections: a row of its own
                rows.append(Row(f"{key}{suffix}", sub.__name__, "(section)", f"One entry of {key}."))
            rows.extend(model_rows(sub, f"{key}{suffix}.", seen + (model,)))
    return rows


#: plugin kinds with their own config sections, and where their keys sit in a run config
PLUGIN_PLACES = {
    "algorithm": "algorithm.",
    "backend": "roles.<name>.options.",
    "engine": "roles.<name>.options.",
    "rollout": "rollout.args.",
    "environment": "algorithm.multi_turn.env.args.",
    "advantage": "algorithm.advantage.",
    "policy_loss": "algorithm.policy_loss.",
    "loss_agg": "algorithm.loss_agg.",
    "kl": "algorithm.kl.estimator.",
    "reward": "rewards[i].args.",
}


def plugin_sections(records: Iterable[Any]) -> list[tuple[str, str, list[Row]]]:
    """``(kind, name, rows)`` for each plugin record with a ``config_model``, its keys placed
    where a run config holds them (:data:`PLUGIN_PLACES`; other kinds: under ``<kind>.``)."""
    out = []
    for rec in sorted(records, key=lambda r: (r.kind, r.name)):
        model = getattr(rec, "config_model", None)
        if model is None:
            continue
        place = PLUGIN_PLACES.get(rec.kind, f"{rec.kind}.")
        out.append((rec.kind, rec.name, model_rows(model, place)))
    return out


def _table(rows: list[Row]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for r in rows:
        cells = [f"`{r.key}`", r.type, f"`{r.default}`", r.description]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return lines


def reference_markdown(core: type[BaseModel], records: Iterable[Any]) -> str:
    """The reference page: the core's keys, then each plugin's own section."""
    lines = ["# Configuration reference", "",
             "Every key of a run config, drawn from the config models (`scripts/config_reference.py` writes",
             "this page; a test fails when it is out of date). Plugins add their own sections below, for",
             "the plugins installed where the page was made: `rlweave list-plugins` shows yours.", "",
             "## Run config", ""]
    lines += _table(model_rows(core))
    for kind, name, rows in plugin_sections(records):
        lines += ["", f"## {kind}: `{name}`", ""]
        lines += _table(rows) if rows else ["(no keys)"]
    return "\n".join(lines) + "\n"
