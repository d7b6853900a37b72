"""Record which config keys code reads, and the value each read returned.

A config key that validation accepts but no code reads does nothing, silently. Mutation
tests catch that: set every key to a non-default value, run the code that should use it,
and check that it read that value. This module does the recording; what counts as a key
and the verdict live in :mod:`rlweave.testing.config_keys`.

Views wrap the config where the code receives it; each read of a leaf (a value that is not
itself a section) is logged under its dotted path, e.g. ``roles.policy.optim.lr``:

* :class:`ModelView` wraps a pydantic model: attribute reads of its fields are logged
  (sections come back as views), ``@property`` code runs against the view (so the fields
  it reads are logged), ``model_dump()`` returns a :class:`RecordingDict`, and
  ``isinstance(view, TheModel)`` holds. Assignments go to the model.
* :class:`RecordingDict` (a ``dict``) logs ``d[key]``, ``d.get(key)``, ``.pop``,
  ``.setdefault``, ``.items()`` and ``.values()``; ``.copy()`` keeps recording.
* :class:`RecordingList` (a ``list``) of sections: indexing and iteration give views.
* :class:`AttrView` wraps any object and logs reads of named attributes under config paths
  (a worker's ``ctx.seed`` is the config's ``run.seed``).

A read of a key that is not there (``d.get("learnig_rate", 1e-5)``, ``getattr(model,
"ppo_epochs", 1)`` on a model without that field) is logged as a :class:`Miss`, with the
existing key of a similar name if there is one: the classic misnamed key.

Copies lose recording: ``dict(d)``, ``{**d}`` and ``f(**d)`` read a ``dict`` subclass in C
without calling its methods, so they log nothing (a copy is not a use). Where code keeps a
copy and reads it later, :meth:`Recorder.adopt_copies` re-wraps plain-dict copies of recorded
dicts found on an object, and :meth:`Recorder.model_factory` builds a plugin's config model
from its ``**``-copied section as a view.

Reads are tagged with the recorder's current ``phase`` (e.g. ``"resolve"`` while plugins are
validated, ``"run"`` otherwise) so a verdict can ignore validation reads. Pure Python; it
imports pydantic only.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class Read:
    """One read of the leaf at ``path`` that returned ``value``, during ``phase``."""

    path: str
    value: Any
    phase: str


@dataclass(frozen=True)
class Miss:
    """A read of ``path``, a key its section does not have; ``close`` is an existing key with
    a similar name (a misnamed key), or None."""

    path: str
    close: str | None
    phase: str


def similar_key(name: str, known: Iterator[str] | list[str]) -> str | None:
    """A key of ``known`` that ``name`` plausibly stands for: nearly the same spelling
    (``learnig_rate``), or one's ``_``-separated words among the other's (``ppo_epochs`` /
    ``epochs``). None when there is none."""
    known = [str(k) for k in known]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
        return close[0]
    words = set(name.split("_"))
    for key in known:
        other = set(key.split("_"))
        if other < words or words < other:
            return key
    return None


def _is_section(value: Any) -> bool:
    """Sections are models and containers of models; everything else is a leaf."""
    if isinstance(value, BaseModel):
        return True
    if isinstance(value, Mapping):
        return bool(value) and all(isinstance(v, BaseModel) for v in value.values())
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, BaseModel) for v in value)
    return False


class Recorder:
    """The log of reads and misses, shared by every view made from it.

    Attributes: ``reads`` (list of :class:`Read`), ``misses`` (list of :class:`Miss`),
    ``phase`` (tag of new reads), ``role`` (the role whose worker code runs now, set by
    whoever drives the workers; see :meth:`model_factory`).
    """

    def __init__(self) -> None:
        self.reads: list[Read] = []
        self.misses: list[Miss] = []
        self.phase = "run"
        self.role: str | None = None
        self._paused = 0
        self._sources: list[tuple[str, dict]] = []

    # ------------------------------------------------------------------ log
    def read(self, path: str, value: Any) -> None:
        if not self._paused:
            self.reads.append(Read(path, value, self.phase))

    def miss(self, path: str, known: Iterator[str] | list[str]) -> None:
        if not self._paused:
            self.misses.append(Miss(path, similar_key(path.rsplit(".", 1)[-1], known), self.phase))

    def values(self, path: str, phases: tuple[str, ...] = ("run",)) -> list[Any]:
        """Values that reads of ``path`` returned during ``phases``."""
        return [r.value for r in self.reads if r.path == path and r.phase in phases]

    # -------------------------------------------------------------- context
    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is logged inside (e.g. while the test itself inspects the config)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        old, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = old

    @contextmanager
    def as_role(self, role: str | None) -> Iterator[None]:
        old, self.role = self.role, role
        try:
            yield
        finally:
            self.role = old

    # ---------------------------------------------------------------- views
    def view(self, value: Any, path: str) -> Any:
        """``value`` found at ``path``: a view for a section or a dict, the value itself
        (logged as a read) for a leaf."""
        if isinstance(value, (ModelView, RecordingDict, RecordingList)):
            return value
        if isinstance(value, BaseModel) and getattr(type(value), "__pydantic_root_model__", False):
            self.read(path, value.model_dump())  # one value (a named algorithm part): a leaf
            return value
        if isinstance(value, BaseModel):
            return ModelView(value, path, self)
        if isinstance(value, dict):
            return RecordingDict(value, path, self)
        if isinstance(value, list) and _is_section(value):
            return RecordingList(value, path, self)
        self.read(path, value)
        return value

    def field(self, model: BaseModel, name: str, path: str) -> Any:
        """The field ``name`` of ``model`` at ``path``: dict fields holding models, and free-form
        dicts (``dict[str, Any]``), are sections; dicts of plain values (``parallel``) are leaves."""
        value = getattr(model, name)
        if isinstance(value, dict) and not _is_section(value) and not _free_form(type(model), name):
            self.read(path, value)
            return value
        return self.view(value, path)

    def dumped(self, data: dict, path: str) -> RecordingDict:
        """A recorded dict that code received as a copy of the section at ``path``; plain
        copies of it that code keeps are found again by :meth:`adopt_copies`."""
        self._sources.append((path, dict(data)))
        return RecordingDict(data, path, self)

    def adopt_copies(self, obj: Any) -> list[str]:
        """Replace plain-dict attributes of ``obj`` equal to a dict handed out by
        :meth:`dumped` with recording views of the same path; returns the attribute names."""
        found = []
        for name, value in list(vars(obj).items()):
            if type(value) is not dict or not value:
                continue
            for path, source in self._sources:
                if value == source:
                    setattr(obj, name, RecordingDict(value, path, self))
                    found.append(name)
                    break
        return found

    def model_factory(self, model_cls: type[BaseModel], section: str = "options") -> Callable[..., Any]:
        """A stand-in for ``model_cls`` in a worker module: builds the model and, while
        :attr:`role` is set, returns it as a view at ``roles.<role>.<section>``: for code that
        builds a model from a ``**``-copy of its section, which would otherwise log nothing."""

        def build(*args: Any, **kwargs: Any) -> Any:
            obj = model_cls(*args, **kwargs)
            return obj if self.role is None else ModelView(obj, f"roles.{self.role}.{section}", self)

        build.__name__ = model_cls.__name__
        return build


def _free_form(cls: type, name: str) -> bool:
    """Whether field ``name`` of model class ``cls`` is ``dict[str, Any]`` (a plugin section)."""
    info = getattr(cls, "model_fields", {}).get(name)
    if info is None:
        return False
    args = typing.get_args(info.annotation)
    return typing.get_origin(info.annotation) is dict and len(args) == 2 and args[1] is Any


def _own_property(cls: type, name: str) -> property | None:
    """A ``@property`` that ``cls`` or a base other than pydantic's defines (run against the
    view, so the fields it uses are logged)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            attr = vars(klass)[name]
            own = not klass.__module__.startswith("pydantic")
            return attr if own and isinstance(attr, property) and attr.fget is not None else None
    return None


def unwrap(value: Any) -> Any:
    """The object a view wraps (anything else unchanged)."""
    if type(value) in (ModelView, AttrView):
        return object.__getattribute__(value, "_obj")
    if isinstance(value, RecordingDict):
        return dict(value)
    if isinstance(value, RecordingList):
        return list(value)
    return value


class ModelView:
    """A pydantic model whose field reads are logged (see the module docstring)."""

    __slots__ = ("_obj", "_path", "_rec")

    def __init__(self, model: BaseModel, path: str, recorder: Recorder) -> None:
        object.__setattr__(self, "_obj", model)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_rec", recorder)

    @property  # isinstance(view, Model) holds, as for unittest.mock
    def __class__(self) -> type:  # type: ignore[override]
        return type(object.__getattribute__(self, "_obj"))

    def __getattr__(self, name: str) -> Any:
        obj: BaseModel = object.__getattribute__(self, "_obj")
        path: str = object.__getattribute__(self, "_path")
        rec: Recorder = object.__getattribute__(self, "_rec")
        cls = type(obj)
        extra = obj.__pydantic_extra__ or {}
        at = f"{path}.{name}" if path else name
        if name in cls.model_fields or name in extra:
            return rec.field(obj, name, at)
        prop = _own_property(cls, name)
        if prop is not None:
            return prop.fget(self)
        if name == "model_dump":
            return lambda *a, **kw: rec.dumped(obj.model_dump(*a, **kw), path)
        try:
            return getattr(obj, name)
        except AttributeError:
            if not name.startswith("_"):
                rec.miss(at, [*cls.model_fields, *extra])
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_obj"), name, unwrap(value))

    def __iter__(self) -> Iterator[tuple[str, Any]]:  # dict(model): a copy, not logged
        return iter(object.__getattribute__(self, "_obj"))

    def __eq__(self, other: object) -> bool:
        return object.__getattribute__(self, "_obj") == unwrap(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ModelView({object.__getattribute__(self, '_path')}: {object.__getattribute__(self, '_obj')!r})"

    def __reduce__(self) -> Any:  # pickling or copying gives the plain model
        return object.__getattribute__(self, "_obj").__reduce__()

    def __copy__(self) -> BaseModel:
        return object.__getattribute__(self, "_obj").model_copy()

    def __deepcopy__(self, memo: dict) -> BaseModel:
        return object.__getattribute__(self, "_obj").model_copy(deep=True)


class RecordingDict(dict):
    """A dict whose key reads are logged under ``<path>.<key>`` (see the module docstring)."""

    def __init__(self, data: Mapping[str, Any], path: str, recorder: Recorder) -> None:
        super().__init__(data)
        self.path = path
        self.recorder = recorder

    def _at(self, key: Any) -> str:
        return f"{self.path}.{key}"

    def __getitem__(self, key: Any) -> Any:
        if not dict.__contains__(self, key):
            self.recorder.miss(self._at(key), list(self.keys()))
            raise KeyError(key)
        return self.recorder.view(dict.__getitem__(self, key), self._at(key))

    def get(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self.recorder.miss(self._at(key), list(self.keys()))
            return default
        return self[key]

    def pop(self, key: Any, *default: Any) -> Any:
        if not dict.__contains__(self, key):
            self.recorder.miss(self._at(key), list(self.keys()))
        value = dict.pop(self, key, *default)
        return self.recorder.view(value, self._at(key))

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self.recorder.miss(self._at(key), list(self.keys()))
            dict.__setitem__(self, key, default)
        return self[key]

    def items(self) -> Any:
        return [(k, self[k]) for k in self.keys()]

    def values(self) -> Any:
        return [self[k] for k in self.keys()]

    def copy(self) -> RecordingDict:
        return RecordingDict(self, self.path, self.recorder)

    def __reduce__(self) -> Any:  # pickles as a plain dict
        return (dict, (dict(self),))


class RecordingList(list):
    """A list of sections whose items come back as views at ``<path>.<index>``."""

    def __init__(self, data: list, path: str, recorder: Recorder) -> None:
        super().__init__(data)
        self.path = path
        self.recorder = recorder

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return list.__getitem__(self, i)
        n = i + len(self) if i < 0 else i
        return self.recorder.view(list.__getitem__(self, i), f"{self.path}.{n}")

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __reduce__(self) -> Any:
        return (list, (list(self),))


class AttrView:
    """``obj`` with the reads of some attributes logged under config paths, e.g. a worker
    context whose ``seed`` is ``run.seed``: ``AttrView(ctx, {"seed": "run.seed"}, rec)``.
    Other attributes and every assignment pass through; ``isinstance`` sees ``obj``'s class."""

    __slots__ = ("_obj", "_paths", "_rec")

    def __init__(self, obj: Any, paths: Mapping[str, str], recorder: Recorder) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_paths", dict(paths))
        object.__setattr__(self, "_rec", recorder)

    @property
    def __class__(self) -> type:  # type: ignore[override]
        return type(object.__getattribute__(self, "_obj"))

    def __getattr__(self, name: str) -> Any:
        value = getattr(object.__getattribute__(self, "_obj"), name)
        path = object.__getattribute__(self, "_paths").get(name)
        if path is not None:
            object.__getattribute__(self, "_rec").read(path, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_obj"), name, value)

    def __repr__(self) -> str:
        return f"AttrView({object.__getattribute__(self, '_obj')!r})"
