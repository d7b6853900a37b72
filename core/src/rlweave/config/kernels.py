"""Which kernels each role's workers receive.

``kernels.<name>: true`` (top level) turns a kernel on for every role whose backend uses it
(:attr:`rlweave.plugins.types.BackendRecord.kernels`); ``roles.<role>.kernels.<name>`` overrides
it for one role: ``true`` turns it on there (that role's backend must use it), ``false`` turns a
top-level one off. A kernel switched on where no backend uses it is a config error, so a
selection is never dropped without a word. Light: no torch import.
"""

from __future__ import annotations

from typing import Any, Mapping


def selected(cfg: Any, role: str) -> dict[str, bool]:
    """The kernel switches of ``role``: the top-level ones with the role's own on top."""
    merged = {name: bool(on) for name, on in cfg.kernels.items()}
    section = cfg.roles.get(role)
    if section is not None:
        merged.update({name: bool(on) for name, on in section.kernels.items()})
    return merged


def role_kernels(cfg: Any, role: str, record: Any) -> list[str]:
    """Names of the kernels ``role``'s ranks receive: switched on for it and used by its
    backend ``record`` (an engine, or a record without ``kernels``, receives none)."""
    used = set(getattr(record, "kernels", ()) or ())
    return sorted(name for name, on in selected(cfg, role).items() if on and name in used)


def kernel_problems(cfg: Any, records: Mapping[str, Any], known: set[str]) -> list[tuple[str, str]]:
    """``(key path, message)`` for kernels switched on where no backend uses them: on a role
    whose plugin does not use it, or at the top level when no role's plugin does. Only the
    kernels in ``known`` (the ones that resolved to a record) are checked."""
    problems: list[tuple[str, str]] = []

    def uses(record: Any) -> tuple[str, ...]:
        return tuple(getattr(record, "kernels", ()) or ())

    def label(role: str, record: Any) -> str:
        return f"{record.kind} '{record.name}' of role '{role}'"

    for role, section in cfg.roles.items():
        record = records.get(role)
        if record is None:
            continue
        for name, on in section.kernels.items():
            if on and name in known and name not in uses(record):
                problems.append((f"roles.{role}.kernels.{name}",
                                 f"{label(role, record)} does not use kernel '{name}' "
                                 f"(kernels it uses: {', '.join(uses(record)) or 'none'})"))
    for name, on in cfg.kernels.items():
        if not on or name not in known:
            continue
        if records and not any(name in uses(rec) for rec in records.values()):
            users = "; ".join(f"{label(r, rec)}: {', '.join(uses(rec)) or 'none'}" for r, rec in records.items())
            problems.append((f"kernels.{name}", f"no role's plugin uses kernel '{name}' (kernels they use: {users}); "
                                                "remove it, or choose a backend that uses it"))
    return problems
