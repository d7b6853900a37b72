"""Resolve a reward named in YAML (``rewards[].name``) to its function.

A name is either a reward plugin's name (``arith_exact``; looked up through the
``rlweave_rewards`` hook) or a user function: ``package.module:function`` (importable) or
``path/to/file.py:function`` (a relative path is taken from the current directory).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Callable

from rlweave.plugins.types import RewardRecord
from rlweave.sandbox.worker import import_reward_target
from rlweave.targets import absolute_reference

RewardFn = Callable[..., float]


def _builtin_records() -> list[RewardRecord]:
    from rlweave.rewards import plugin

    return list(plugin.rlweave_rewards())


def reward_records(pm: Any = None) -> dict[str, RewardRecord]:
    """name -> :class:`RewardRecord` from ``pm``.

    ``pm`` may be a pluggy ``PluginManager`` with the rlweave hookspecs (its
    ``hook.rlweave_rewards()`` is called), a mapping name -> record, an iterable of records,
    or ``None`` (only the built-in rewards).
    """
    if pm is None:
        records: Iterable[Any] = _builtin_records()
    elif isinstance(pm, Mapping):
        records = pm.values()
    elif hasattr(pm, "hook") and hasattr(pm.hook, "rlweave_rewards"):
        records = [r for batch in pm.hook.rlweave_rewards() for r in (batch or [])]
    else:
        records = pm
    out: dict[str, RewardRecord] = {}
    for rec in records:
        if not isinstance(rec, RewardRecord):
            raise TypeError(f"rlweave_rewards returned {rec!r}, expected RewardRecord")
        out.setdefault(rec.name, rec)
    return out


def resolve_reward_target(name: str, pm: Any = None) -> str:
    """The ``module:function`` import string for ``name`` (a plugin name or already one)."""
    if ":" in name:
        return absolute_reference(name)
    records = reward_records(pm)
    if name in records:
        return records[name].target
    choices = ", ".join(sorted(records)) or "(none installed)"
    close = difflib.get_close_matches(name, list(records), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"unknown reward {name!r} (rewards[].name). Choose one of: {choices}, "
        f"or give a user function as 'package.module:function' or 'path/file.py:function'.{hint}"
    )


def load_reward_fn(name_or_module_function: str, pm: Any = None) -> RewardFn:
    """Import and return the reward function named in YAML; errors name the reward."""
    target = resolve_reward_target(name_or_module_function, pm)
    try:
        fn = import_reward_target(target)
    except Exception as exc:  # import errors of user code: name what failed
        raise ImportError(
            f"reward {name_or_module_function!r}: cannot import {target!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(fn):
        raise TypeError(f"reward {name_or_module_function!r}: {target!r} is not callable")
    return fn
