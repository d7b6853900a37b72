"""Which config keys exist, which ones a config sets to non-default values, and whether the
code read those values: the bookkeeping of a config mutation test.

* :func:`key_universe` lists every key a user can set, as templates with placeholders
  (``roles.<role>.timeouts.train``, ``resources.pools.<pool>.nodes``, ``rewards.<i>.weight``)
  and, for plugin-owned sections, the plugin in brackets (``roles.<role>.options.use_packing
  [fsdp]``, ``algorithm.kl.beta [grpo]``, ``rewards.<i>.args.mode [arith_exact]``): the
  core schema plus the config model of every installed plugin; reward args without a model
  are the reward function's named parameters.
* :func:`mutations` walks a config as the user wrote it and returns the concrete keys it sets
  (with their values after validation), each mapped to its template; a key set to its
  default is reported, as it mutates nothing.
* :func:`judge` takes the mutations and recorded reads (:mod:`rlweave.testing.config_reach`)
  of one or more runs and gives one :class:`Verdict` per key template.

Light: pydantic and the plugin manager only.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rlweave.config.schema import AlgorithmSection, RunConfig

#: dict-of-section fields whose keys the user names -> placeholder (others: ``<key>``; list items: ``<i>``)
PLACEHOLDERS = {"roles": "<role>", "pools": "<pool>"}
#: parameters of a reward function that are not ``args``: the sample itself
REWARD_SAMPLE_PARAMS = ("prompt", "response")


@dataclass(frozen=True)
class Key:
    """A key template: ``path`` with placeholders, ``plugin`` for plugin-owned sections."""

    path: str
    plugin: str | None = None

    def __str__(self) -> str:
        return self.path + (f" [{self.plugin}]" if self.plugin else "")


@dataclass(frozen=True)
class Mutation:
    """The concrete ``path`` a config sets to ``value`` (non-default), an instance of ``key``."""

    key: Key
    path: str
    value: Any


def _optional_inner(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _model(tp: Any) -> type[BaseModel] | None:
    """A section model; a ``RootModel`` (one value, such as a named algorithm part) is a leaf."""
    if isinstance(tp, type) and issubclass(tp, BaseModel) and not getattr(tp, "__pydantic_root_model__", False):
        return tp
    return None


def _child_model(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """``("model", M)``, ``("dict", M)`` for ``dict[str, M]``, ``("list", M)`` for ``list[M]``."""
    for inner in _optional_inner(annotation):
        if _model(inner):
            return "model", inner
        origin, args = typing.get_origin(inner), typing.get_args(inner)
        if origin is dict and len(args) == 2 and _model(args[1]):
            return "dict", args[1]
        if origin in (list, tuple) and args and _model(args[0]):
            return "list", args[0]
    return None


def _free_form(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) is dict and len(args) == 2 and args[1] is Any


def model_keys(model: type[BaseModel], prefix: str = "", plugin: str | None = None,
               skip: Sequence[str] = ()) -> dict[Key, FieldInfo]:
    """Leaf keys of ``model`` under ``prefix``: sections are walked (``dict[str, M]`` and
    ``list[M]`` with a placeholder), free-form ``dict[str, Any]`` fields (plugin sections)
    and the dotted paths in ``skip`` are left out."""
    out: dict[Key, FieldInfo] = {}
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        if path in skip or _free_form(info.annotation):
            continue
        child = _child_model(info.annotation)
        if child is None:
            out[Key(path, plugin)] = info
            continue
        how, sub = child
        if how == "dict":
            path = f"{path}.{PLACEHOLDERS.get(name, '<key>')}"
        elif how == "list":
            path = f"{path}.<i>"
        out.update(model_keys(sub, path, plugin, skip))
    return out


def reward_arg_keys(fn: Any) -> list[inspect.Parameter]:
    """Named parameters of a reward function that ``args`` can set (a key that is none of
    them lands in the function's ``**kwargs``, if it has one, and is ignored)."""
    params = inspect.signature(fn).parameters.values()
    return [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in REWARD_SAMPLE_PARAMS]


@dataclass
class Universe:
    """Every key template (``keys``: template -> field info; a reward parameter's holds its
    default) and the ones no run here can read, with why (``unavailable``)."""

    keys: dict[Key, FieldInfo] = field(default_factory=dict)
    unavailable: dict[Key, str] = field(default_factory=dict)


def key_universe(pm: Any, record_fields: Mapping[str, Sequence[str]] = {}) -> Universe:
    """The core schema's keys plus those of every plugin ``pm`` offers: backend/engine options,
    algorithm settings (beside ``name``), reward args. ``record_fields``: reward name ->
    parameters filled from the data record rather than ``args`` (e.g. ``answer``). Keys of
    plugins whose probe refuses this machine go to ``unavailable`` with the probe's reason."""
    uni = Universe()
    uni.keys.update(model_keys(RunConfig))
    sections = {"backend": "roles.<role>.options", "engine": "roles.<role>.options", "algorithm": "algorithm",
                "reward": "rewards.<i>.args"}
    for kind, prefix in sections.items():
        for provided in pm.providers(kind):
            rec = provided.record
            if rec.config_model is not None:
                keys: dict[Key, FieldInfo] = dict(model_keys(rec.config_model, prefix, rec.name,
                                                                    skip=("algorithm.name",)))
            elif kind == "reward":
                try:
                    params = reward_arg_keys(rec.load())
                except Exception as exc:  # noqa: BLE001 - a broken reward: its keys cannot be listed
                    uni.unavailable[Key(f"{prefix}.*", rec.name)] = f"cannot load: {exc}"
                    continue
                skip = set(record_fields.get(rec.name, ()))
                keys = {Key(f"{prefix}.{p.name}", rec.name): FieldInfo(default=p.default)
                        for p in params if p.name not in skip}
            else:
                continue
            if provided.status in ("ok", "conflict"):
                uni.keys.update(keys)
            else:
                why = f"{kind} '{rec.name}' is {provided.status} here: {provided.error}"
                uni.unavailable.update(dict.fromkeys(keys, why))
    return uni


# ------------------------------------------------------------------ mutations
def _template(parts: list[str]) -> str:
    out = []
    for i, part in enumerate(parts):
        prev = parts[i - 1] if i else None
        out.append(PLACEHOLDERS[prev] if prev in PLACEHOLDERS else "<i>" if part.isdigit() else part)
    return ".".join(out)


def _plugin_of(cfg: RunConfig, parts: list[str]) -> str | None:
    if parts[0] == "algorithm" and len(parts) > 1 and parts[1] not in AlgorithmSection.model_fields:
        return cfg.algorithm.name  # the core's own keys of the section (name, reference) belong to no plugin
    if parts[0] == "roles" and len(parts) > 3 and parts[2] == "options" and parts[1] in cfg.roles:
        role = cfg.roles[parts[1]]
        return role.backend or role.engine
    if parts[0] == "rewards" and len(parts) > 3 and parts[2] == "args" and parts[1].isdigit():
        i = int(parts[1])
        return cfg.rewards[i].name if i < len(cfg.rewards) else None
    return None


def key_of(cfg: RunConfig, path: str) -> Key:
    """The template of the concrete dotted ``path`` of ``cfg`` (plugin sections named)."""
    parts = path.split(".")
    return Key(_template(parts), _plugin_of(cfg, parts))


def normalized(value: Any) -> Any:
    """JSON-like form for comparing values (tuples as lists, models as dicts)."""
    if isinstance(value, BaseModel):
        return normalized(value.model_dump())
    if isinstance(value, Mapping):
        return {k: normalized(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalized(v) for v in value]
    return value


def _default(info: FieldInfo | None) -> Any:
    if info is None or info.is_required() or info.default is inspect.Parameter.empty:
        return inspect.Parameter.empty
    return normalized(info.get_default(call_default_factory=True))


def mutations(cfg: RunConfig, user: Mapping[str, Any], universe: Universe) -> tuple[list[Mutation], list[str]]:
    """The keys ``user`` (the config as written, before validation) sets, with their values in
    ``cfg`` (the validated, resolved config: what code reads). Returns ``(mutations, problems)``:
    a problem is a key set to its default (not a mutation) or one the universe does not know."""
    known = set(universe.keys) | set(universe.unavailable)
    out: list[Mutation] = []
    problems: list[str] = []
    resolved = cfg.model_dump(mode="python")

    def walk(node: Any, got: Any, parts: list[str]) -> None:
        key = key_of(cfg, ".".join(parts)) if parts else None
        if key is not None and key in known:
            value = normalized(got)
            default = _default(universe.keys.get(key))
            if default is not inspect.Parameter.empty and value == default:
                problems.append(f"{'.'.join(parts)} = {value!r} is its default ({key}): not a mutation")
            else:
                out.append(Mutation(key, ".".join(parts), value))
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, got[k] if isinstance(got, Mapping) and k in got else None, [*parts, str(k)])
        elif isinstance(node, list) and node and all(isinstance(v, Mapping) for v in node):
            for i, v in enumerate(node):
                walk(v, got[i] if isinstance(got, list) and i < len(got) else None, [*parts, str(i)])
        else:
            problems.append(f"{'.'.join(parts)}: not a key of the schema or of an installed plugin ({key})")

    walk(dict(user), resolved, [])
    return out, problems


# ------------------------------------------------------------------ verdict
@dataclass(frozen=True)
class Verdict:
    """Outcome for one key template: ``status`` is ``read`` (some mutated instance was read
    with its mutated value), ``exempt`` (allow-listed, ``detail`` = reason), ``unavailable``,
    or a failure: ``not-mutated``, ``unread``, ``wrong-value``, ``stale-exemption``."""

    key: Key
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("read", "exempt", "unavailable")


def judge(universe: Universe, runs: Iterable[tuple[str, list[Mutation], Any]],
          exempt: Mapping[Key, str] = {}, resolve_keys: Iterable[Key] = ()) -> list[Verdict]:
    """One verdict per key of ``universe``.

    ``runs``: ``(name, mutations, recorder)`` per run. A key passes when one of its mutated
    instances was read with the mutated value during the ``run`` phase (also the ``resolve``
    phase for ``resolve_keys``: keys whose consumer is plugin resolution, e.g.
    ``roles.<role>.engine``). ``exempt`` keys must not pass (else ``stale-exemption``).
    """
    runs = list(runs)
    resolve_keys = set(resolve_keys)
    out = []
    for key in sorted({*universe.keys, *universe.unavailable}, key=str):
        phases = ("run", "resolve") if key in resolve_keys else ("run",)
        instances = [(name, m, rec) for name, muts, rec in runs for m in muts if m.key == key]
        hit = next((f"{m.path} in {name}" for name, m, rec in instances
                    if any(normalized(v) == m.value for v in rec.values(m.path, phases))), None)
        if key in exempt:
            out.append(Verdict(key, "stale-exemption", f"exempt ({exempt[key]}) but read: {hit}") if hit
                       else Verdict(key, "exempt", exempt[key]))
        elif key in universe.unavailable:
            out.append(Verdict(key, "unavailable", universe.unavailable[key]))
        elif hit:
            out.append(Verdict(key, "read", hit))
        elif not instances:
            out.append(Verdict(key, "not-mutated", "no run sets it to a non-default value"))
        else:
            seen = []
            for name, m, rec in instances:
                vals = rec.values(m.path, phases)
                seen.append(f"{m.path} in {name}: set to {m.value!r}, "
                            + (f"read as {sorted({repr(normalized(v)) for v in vals})}" if vals else "never read"))
            status = "wrong-value" if any(rec.values(m.path, phases) for _, m, rec in instances) else "unread"
            out.append(Verdict(key, status, "; ".join(seen)))
    return out


def summary(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """Counts per status."""
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.status] = counts.get(v.status, 0) + 1
    return counts
