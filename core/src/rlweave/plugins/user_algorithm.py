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

Validation imports the module (that is how its roles and keys are known) and refuses a bad
name with one clear message: malformed, module or file not found, import failed, attribute
missing, not an ``Algorithm`` subclass, abstract, bad ``config_model``. A module that was
found only through the config's folder or the current directory is pickled by value when its
objects (a loss function, say) travel to the Ray workers, so the workers need not import it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rlweave.plugins.errors import PluginError
from rlweave.plugins.types import AlgorithmRecord

FILE_MODULE_PREFIX = "rlweave_user_algorithm_"
#: top-level modules found only through the config's folder or the current directory
_FOUND_IN_DIRS: set[str] = set()


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


def import_algorithm(name: str, dirs: tuple[str, ...]) -> tuple[type, bool]:
    """``(class, by_value)`` for ``name`` (``module:Class`` or ``file.py:Class``): ``by_value`` is
    true when the module was found only in ``dirs`` (so Ray workers could not import it)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or ":" in attr:
        raise UserAlgorithmError(f"'{name}' must be an algorithm plugin's name, or 'module:Class' or "
                                 "'path/file.py:Class' of an Algorithm subclass")
    if module_name.endswith(".py"):
        module, by_value = _import_file(name, module_name, dirs), True
    else:
        module, by_value = _import_module(name, module_name, dirs)
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = f"module '{module_name}'" if i == 0 else f"'{module_name}:{'.'.join(attr.split('.')[:i])}'"
            raise UserAlgorithmError(f"{where} has no attribute '{part}'{_candidates(module, part)}")
        obj = getattr(obj, part)
    _check_class(name, obj)
    return obj, by_value


def _import_module(name: str, module_name: str, dirs: tuple[str, ...]) -> tuple[ModuleType, bool]:
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        sys.path.extend(d for d in dirs if d not in sys.path)
        importlib.invalidate_caches()
        if importlib.util.find_spec(top) is None:
            raise UserAlgorithmError(f"module '{top}' of algorithm '{name}' not found: not on PYTHONPATH, nor in "
                                     f"{' or '.join(dirs)}")
        _FOUND_IN_DIRS.add(top)
    by_value = top in _FOUND_IN_DIRS
    try:
        return importlib.import_module(module_name), by_value
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UserAlgorithmError(f"module '{exc.name}' of algorithm '{name}' not found") from None
        raise _import_failed(name, module_name, exc) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing: say so
        raise _import_failed(name, module_name, exc) from None


def _import_file(name: str, file: str, dirs: tuple[str, ...]) -> ModuleType:
    candidates = [Path(file)] if os.path.isabs(file) else [Path(d) / file for d in dirs]
    path = next((p.resolve() for p in candidates if p.is_file()), None)
    if path is None:
        raise UserAlgorithmError(f"file '{file}' of algorithm '{name}' not found (looked for "
                                 f"{', '.join(map(str, candidates))})")
    module_name = FILE_MODULE_PREFIX + "".join(c if c.isalnum() else "_" for c in str(path))
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserAlgorithmError(f"file '{path}' of algorithm '{name}' is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file raised while importing: say so
        sys.modules.pop(module_name, None)
        raise _import_failed(name, str(path), exc) from None
    return module


def _import_failed(name: str, module: str, exc: Exception) -> UserAlgorithmError:
    from rlweave.deps import missing_dependency

    missing = missing_dependency(exc)
    why = str(missing) if missing is not None else f"{type(exc).__name__}: {exc}"
    return UserAlgorithmError(f"importing '{module}' of algorithm '{name}' failed: {why}")


def _algorithm_classes(module: ModuleType) -> list[str]:
    from rlweave.interfaces.algorithm import Algorithm

    return sorted(k for k, v in vars(module).items()
                  if inspect.isclass(v) and issubclass(v, Algorithm) and not inspect.isabstract(v))


def _candidates(module: ModuleType, wanted: str) -> str:
    names = _algorithm_classes(module)
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
    if close:
        return f". Did you mean '{close[0]}'?"
    return f" (its Algorithm subclasses: {', '.join(names)})" if names else " (it defines no Algorithm subclass)"


def _check_class(name: str, obj: Any) -> None:
    from pydantic import BaseModel

    from rlweave.interfaces.algorithm import Algorithm

    if not inspect.isclass(obj):
        raise UserAlgorithmError(f"'{name}' is a {type(obj).__name__}, not a subclass of "
                                 "rlweave.interfaces.algorithm.Algorithm")
    if not issubclass(obj, Algorithm):
        raise UserAlgorithmError(f"'{name}' is not a subclass of rlweave.interfaces.algorithm.Algorithm")
    if inspect.isabstract(obj):
        missing = ", ".join(f"{m}()" for m in sorted(obj.__abstractmethods__))
        raise UserAlgorithmError(f"'{name}' does not implement {missing}")
    model = obj.config_model
    if model is not None and not (inspect.isclass(model) and issubclass(model, BaseModel)):
        raise UserAlgorithmError(f"'{name}': config_model must be a pydantic BaseModel subclass or None, "
                                 f"got {model!r}")


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
