"""Import targets: strings that name an object to import later.

Two forms, one module:

* :func:`import_target` (``"package.module:attr.sub"``): how plugin records point at their heavy
  code (:meth:`rlweave.plugins.types.PluginRecord.load`), and the kernels a worker is handed
  (:meth:`rlweave.interfaces.worker.WorkerContext.kernel`);
* :func:`import_reference`: a user's own object named in a config in place of a plugin
  (``module:Name`` or ``path/to/file.py:Name``: an algorithm, an environment, a tool, a tool
  parser, a reward, an algorithm part). Every kind resolves its references here, so a bad one
  fails the same way for all of them: a :class:`TargetError` whose message names the kind, the
  reference and what is wrong (malformed, file or module not found, import failed, attribute
  missing with the candidates, not the kind of object wanted), fit for one line of a config error.

Standard library only and imports nothing of rlweave, so every layer (the sandbox's worker
processes included) can use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


def import_target(target: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute.

    Raises ImportError/AttributeError with the target named, so a broken selection
    says which plugin object could not be loaded.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"import target {target!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class TargetError(ValueError):
    """A reference names nothing usable; the message says why in one line. ``cause``: the
    exception the user's module raised while importing (``None`` for every other reason).
    A ``ValueError``, so a pydantic validator that resolves a reference reports it at its key."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def is_reference(name: str) -> bool:
    """Whether a name in a config is a reference (``module:Name``) rather than a plugin's name."""
    return ":" in name


def functions_of(module: ModuleType) -> list[str]:
    """The public functions defined in ``module`` (the candidates shown for a missing function)."""
    return sorted(k for k, v in vars(module).items()
                  if not k.startswith("_") and inspect.isfunction(v) and v.__module__ == module.__name__)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class ReferenceKind:
    """What a kind of reference expects, for its messages and checks.

    Attributes:
        label: the kind as messages name it (``reward``, ``tool``, ``environment``...).
        what: what the name after the colon is (``function`` or ``Class``), for the form message.
        members: the module's candidates for a missing attribute (default: its functions).
        members_label: how the candidates are named (``its functions: a, b``).
        check: ``obj -> None | problem`` run on the object found (e.g. "is not callable").
        explain: ``exception -> None | text`` for an import that failed (e.g. a missing package
            named with what to install); ``None``: the exception's type and message.
        module_prefix: the ``sys.modules`` name prefix of modules imported from files.
    """

    label: str
    what: str = "function"
    members: Callable[[ModuleType], list[str]] = functions_of
    members_label: str = "functions"
    check: Callable[[Any], str | None] | None = None
    explain: Callable[[BaseException], str | None] | None = None
    module_prefix: str = "rlweave_user_"


def callable_check(obj: Any) -> str | None:
    """The default check of function references: the object must be callable."""
    return None if callable(obj) else f"is not callable (type {type(obj).__name__})"


def _search(dirs: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(dirs)) if dirs else (os.getcwd(),)


def import_reference(ref: str, kind: ReferenceKind, dirs: Sequence[str] | None = None) -> tuple[Any, bool]:
    """``(object, by_value)`` for ``ref`` (``module:Name``, ``package.module:Name.attr`` or
    ``path/file.py:Name``), checked with ``kind.check``.

    A file is taken as given when absolute, else from the first of ``dirs`` (default: the current
    directory) that holds it. A module is imported from ``sys.path``; when its top package is not
    there, ``dirs`` are appended to ``sys.path`` (and stay, so it can import its neighbours).
    ``by_value`` is true when the object's module came from a file or only from ``dirs`` (a
    process started elsewhere could not import it by name).

    Raises:
        TargetError: one line naming ``kind.label``, ``ref`` and what is wrong.
    """
    module_name, _, attr = ref.partition(":")
    label = kind.label
    if not module_name or not attr or ":" in attr or not all(attr.split(".")):
        raise TargetError(f"{label} '{ref}' must look like 'module:{kind.what}' or 'path/file.py:{kind.what}'")
    search = _search(dirs)
    if module_name.endswith(".py"):
        module, by_value = _import_file(ref, module_name, search, kind), True
    else:
        module, by_value = _import_module(ref, module_name, search, kind)
    obj: Any = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            where = f"module '{module_name}'" if i == 0 else f"'{module_name}:{'.'.join(parts[:i])}'"
            raise TargetError(f"{label} '{ref}': {where} has no attribute '{part}'"
                              f"{_candidates(module, part, kind) if i == 0 else ''}")
        obj = getattr(obj, part)
    problem = kind.check(obj) if kind.check is not None else None
    if problem:
        raise TargetError(f"{label} '{ref}' {problem}")
    return obj, by_value


def _import_failed(ref: str, module: str, exc: BaseException, kind: ReferenceKind) -> TargetError:
    why = kind.explain(exc) if kind.explain is not None else None
    return TargetError(f"importing '{module}' of {kind.label} '{ref}' failed: {why or _why(exc)}", cause=exc)


#: top-level modules found only through the search directories (so by value for other processes)
_FOUND_IN_DIRS: set[str] = set()


def _import_module(ref: str, module_name: str, dirs: tuple[str, ...], kind: ReferenceKind) -> tuple[ModuleType, bool]:
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        sys.path.extend(d for d in dirs if d not in sys.path)
        importlib.invalidate_caches()
        if importlib.util.find_spec(top) is None:
            raise TargetError(f"module '{top}' of {kind.label} '{ref}' not found: not on PYTHONPATH, nor in "
                              f"{' or '.join(dirs)}")
        _FOUND_IN_DIRS.add(top)
    try:
        return importlib.import_module(module_name), top in _FOUND_IN_DIRS
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise TargetError(f"module '{exc.name}' of {kind.label} '{ref}' not found") from None
        raise _import_failed(ref, module_name, exc, kind) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing: say so
        raise _import_failed(ref, module_name, exc, kind) from exc


def file_module_name(path: str | os.PathLike[str], prefix: str = "rlweave_user_") -> str:
    """The ``sys.modules`` name of the module imported from the file at ``path`` (absolute)."""
    return prefix + "".join(c if c.isalnum() else "_" for c in str(path))


def find_file(file: str, dirs: Sequence[str] | None = None) -> tuple[Path | None, list[Path]]:
    """``(the file, the places looked at)``: ``file`` as given when absolute, else the first of
    ``dirs`` (default: the current directory) that holds it."""
    candidates = [Path(file)] if os.path.isabs(file) else [Path(d) / file for d in _search(dirs)]
    return next((p.resolve() for p in candidates if p.is_file()), None), candidates


def _import_file(ref: str, file: str, dirs: tuple[str, ...], kind: ReferenceKind) -> ModuleType:
    path, candidates = find_file(file, dirs)
    if path is None:
        raise TargetError(f"file '{file}' of {kind.label} '{ref}' not found (looked for "
                          f"{', '.join(map(str, candidates))})")
    module_name = file_module_name(path, kind.module_prefix)
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"file '{path}' of {kind.label} '{ref}' is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file raised while importing: say so
        sys.modules.pop(module_name, None)
        raise _import_failed(ref, str(path), exc, kind) from exc
    return module


def _candidates(module: ModuleType, wanted: str, kind: ReferenceKind) -> str:
    import difflib

    names = kind.members(module)
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
    if close:
        return f". Did you mean '{close[0]}'?"
    return f" (its {kind.members_label}: {', '.join(names)})" if names else f" (it defines no {kind.members_label})"


def absolute_reference(ref: str, dirs: Sequence[str] | None = None) -> str:
    """``ref`` with a relative ``file.py`` made absolute (the first of ``dirs`` holding it, default
    the current directory), so a process in another directory (a sandboxed worker) finds it; any
    other reference unchanged."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name.endswith(".py") or os.path.isabs(module_name):
        return ref
    path, candidates = find_file(module_name, dirs)
    return f"{path if path is not None else os.path.abspath(candidates[0])}:{attr}"
