"""References to a user's own objects in a config, checked the same way for every kind.

Where a config names a plugin it may name the user's object instead: ``module:Name`` or
``path/to/file.py:Name`` (an algorithm, an environment, a tool, a tool parser, a reward, an
algorithm part). :func:`reference_kind` describes a kind for
:func:`rlweave.targets.import_reference` (the one resolver they all use) with the command line's
wording for a module that fails to import because a package is missing; :func:`user_function`
resolves a reference to a function. Both raise :class:`~rlweave.targets.TargetError` (a
``ValueError``) with one line naming the kind, the reference and what is wrong.

Relative files are taken from the current directory, as the run takes them, unless ``dirs``
says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlweave.targets import ReferenceKind, callable_check, import_reference


def explain_import_error(exc: BaseException) -> str | None:
    """A missing package named with what to install (:func:`rlweave.deps.missing_dependency`), else None."""
    from rlweave.deps import missing_dependency

    missing = missing_dependency(exc)
    return str(missing) if missing is not None else None


def reference_kind(label: str, check: Callable[[Any], str | None] | None = callable_check,
                   **kw: Any) -> ReferenceKind:
    """The :class:`ReferenceKind` of ``label`` (default: a function) with the command line's wording
    of missing packages; ``kw``: its other fields."""
    return ReferenceKind(label, check=check, explain=explain_import_error, **kw)


def user_function(ref: str, label: str, dirs: Sequence[str] | None = None) -> Callable[..., Any]:
    """The function ``ref`` names (``label``: its kind in messages: reward, tool, tool parser...).

    Raises:
        TargetError: malformed, file or module not found, import failed, no such function, or
            not callable.
    """
    return import_reference(ref, reference_kind(label), dirs)[0]
