"""Algorithms named by import path: ``algorithm.name: my_module:MyAlgorithm``.

A run can use an :class:`~rlweave.interfaces.algorithm.Algorithm` subclass from a local file
without packaging it as a plugin, as ``rewards[].name: module:function`` does for rewards.
``algorithm.name`` is then

* ``module:Class`` (``package.module:Class`` too): the module is imported from ``PYTHONPATH``
  or, when it is not found there, from the config file's folder or the current directory
  (those two are then appended to ``sys.path`` and stay there, so the module can import its
  neighbours later);
* ``path/file.py:Class``: a file, relative to the config file's folder, else to the current
  directory.

The class says what a plugin's record would: its docstring's first line is the summary,
``config_model`` validates the keys beside ``algorithm.name``, and ``required_roles(config)``
names the roles it needs (see :class:`~rlweave.interfaces.algorithm.Algorithm`).

Validation imports the module (that is how its roles and keys are known) through the resolver
every kind of reference shares (:func:`rlweave.targets.import_reference`) and refuses a bad
name with one clear message: malformed, module or file not found, import failed, attribute
missing, not an ``Algorithm`` subclass, abstract, bad ``config_model``. A module that was
found only through the config's folder or the current directory is pickled by value when its
objects (a loss function, say) travel to the Ray workers, so the workers need not import it.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rlweave.plugins.errors import PluginError
from rlweave.plugins.types import AlgorithmRecord
from rlweave.plugins.references import reference_kind
from rlweave.targets import TargetError, import_reference

FILE_MODULE_PREFIX = "rlweave_user_algorithm_"


class UserAlgorithmError(PluginError):
    """``algorithm.name`` names a ``module:Class`` that cannot be used; the message says why."""


def is_import_path(name: str) -> bool:
    """Whether ``algorithm.name`` is an import path (``module:Class``) rather than a plugin name."""
    return ":" in name


@dataclass(frozen=True)
class UserAlgorithmRecord(AlgorithmRecord):
    """The record of an algorithm named by import path; ``search_dirs``: the config's folder
    and the current directory, where its module may be."""

    search_dirs: tuple[str, ...] = ()

    def load(self) -> Any:
        cls, by_value = import_algorithm(self.target, self.search_dirs)
        if by_value:
            _pickle_by_value(sys.modules[cls.__module__])
        return cls


def search_dirs(config_path: str | os.PathLike[str] | None) -> tuple[str, ...]:
    """The config file's folder (when ``config_path`` is a file) and the current directory."""
    dirs = []
    if config_path is not None and Path(config_path).is_file():
        dirs.append(str(Path(config_path).resolve().parent))
    dirs.append(os.getcwd())
    return tuple(dict.fromkeys(dirs))


def user_algorithm_record(name: str, dirs: tuple[str, ...]) -> UserAlgorithmRecord:
    """Import the class ``name`` points at and describe it as a record; raises
    :class:`UserAlgorithmError` saying what is wrong with the name."""
    cls, _ = import_algorithm(name, dirs)
    doc = inspect.getdoc(cls) or ""
    return UserAlgorithmRecord(name=name, summary=doc.splitlines()[0] if doc else cls.__qualname__, target=name,
                               config_model=cls.config_model, roles=cls.required_roles, search_dirs=dirs,
                               run_modes=tuple(getattr(cls, "run_modes", ("sync",))),
                               partial_rollout=bool(getattr(cls, "partial_rollout", False)),
                               rollout=bool(getattr(cls, "uses_rollout", False)))


def _algorithm_classes(module: ModuleType) -> list[str]:
    from rlweave.interfaces.algorithm import Algorithm

    return sorted(k for k, v in vars(module).items()
                  if inspect.isclass(v) and issubclass(v, Algorithm) and not inspect.isabstract(v))


def _class_problem(obj: Any) -> str | None:
    from pydantic import BaseModel

    from rlweave.interfaces.algorithm import Algorithm

    if not inspect.isclass(obj):
        return f"is a {type(obj).__name__}, not a subclass of rlweave.interfaces.algorithm.Algorithm"
    if not issubclass(obj, Algorithm):
        return "is not a subclass of rlweave.interfaces.algorithm.Algorithm"
    if inspect.isabstract(obj):
        return f"does not implement {', '.join(f'{m}()' for m in sorted(obj.__abstractmethods__))}"
    model = obj.config_model
    if model is not None and not (inspect.isclass(model) and issubclass(model, BaseModel)):
        return f"has a config_model that is not a pydantic BaseModel subclass or None: {model!r}"
    return None


#: what an algorithm reference must name (:func:`rlweave.targets.import_reference`)
ALGORITHM = reference_kind("algorithm", what="Class", members=_algorithm_classes, members_label="Algorithm subclasses",
                           check=_class_problem, module_prefix=FILE_MODULE_PREFIX)


def import_algorithm(name: str, dirs: tuple[str, ...]) -> tuple[type, bool]:
    """``(class, by_value)`` for ``name`` (``module:Class`` or ``file.py:Class``): ``by_value`` is
    true when the module was found only in ``dirs`` or in a file (so Ray workers could not
    import it). Raises :class:`UserAlgorithmError` saying what is wrong."""
    try:
        return import_reference(name, ALGORITHM, dirs)
    except TargetError as exc:
        raise UserAlgorithmError(str(exc)) from None


def _pickle_by_value(module: ModuleType) -> None:
    """Make Ray pickle the classes and functions of ``module`` by value (the workers may not
    be able to import it)."""
    try:
        from ray import cloudpickle
    except ImportError:  # no Ray: nothing travels to workers
        return
    top = sys.modules.get(module.__name__.split(".")[0], module)
    try:
        cloudpickle.register_pickle_by_value(top)
    except ValueError:  # already registered, or not a module cloudpickle accepts
        pass
