"""The plugin manager: discovers plugins, isolates failures, resolves names to records.

Discovery loads every entry point of the group ``rlweave.plugins`` in its own try/except
(never pluggy's ``load_setuptools_entrypoints``), registers the module with pluggy, rejects
functions named ``rlweave_*`` that are not hooks (like tox's ``check_pending``), calls each
hook of that plugin alone and checks what it returned. Nothing here imports torch or ray;
heavy code is imported later by ``record.load()``.

A plugin that fails is not fatal: it is kept with a status (see :mod:`.status`) so that
``rlweave list-plugins`` can show it, and :meth:`PluginManager.get` raises a clear
:class:`~rlweave.plugins.errors.PluginError` only when a run selects one of its names. The
same holds for a record whose ``probe()`` says it cannot run here (``unavailable``): listed
with its reason, refused with that reason when selected.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata as md
from typing import Any, Iterable, Mapping

import pluggy
from packaging.requirements import Requirement

import rlweave
from rlweave.plugins import hookspecs
from rlweave.plugins.errors import PluginConflictError, PluginUnavailableError, UnknownPluginError
from rlweave.plugins.selection import canonical, disabled_reason
from rlweave.plugins.status import (
    BROKEN,
    CONFLICT,
    DISABLED,
    INCOMPATIBLE,
    KIND_LABELS,
    OK,
    UNAVAILABLE,
    PluginInfo,
    Provided,
)
from rlweave.plugins.types import RECORD_TYPES, PluginRecord

GROUP = "rlweave.plugins"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def iter_entry_points() -> list[md.EntryPoint]:
    """Entry points of :data:`GROUP`, one per (distribution, name), sorted for stable output."""
    seen: dict[tuple[str, str], md.EntryPoint] = {}
    for ep in md.entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        seen.setdefault((canonical(dist), ep.name), ep)
    return [seen[k] for k in sorted(seen)]


def requirement_problem(dist: md.Distribution | None) -> str | None:
    """Say why ``dist`` cannot work with this rlweave (its ``rlweave`` requirement), or None."""
    for line in (dist.requires or []) if dist is not None else []:
        try:
            req = Requirement(line)
        except Exception:  # an unparsable Requires-Dist line is not ours to judge
            continue
        if canonical(req.name) == "rlweave" and req.marker is None and req.specifier:
            if not req.specifier.contains(rlweave.__version__, prereleases=True):
                return f"requires rlweave{req.specifier} but rlweave {rlweave.__version__} is installed"
    return None


class PluginManager:
    """Registry of all plugins and the records they offer.

    Args:
        load_entry_points: discover installed plugins now (default). Tests pass False and
            add plugins with :meth:`register`.
        env: environment for the allow/block lists (default ``os.environ``).
    """

    def __init__(self, *, load_entry_points: bool = True, env: Mapping[str, str] | None = None) -> None:
        self.env = env
        self.plugins: list[PluginInfo] = []
        self._probed: dict[int, tuple[PluginRecord, str, str | None]] = {}
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        if load_entry_points:
            self.load_entry_points()

    # ---------------------------------------------------------------- discovery
    def load_entry_points(self) -> None:
        """Load every entry point of the group in isolation; never raises for a plugin."""
        try:
            eps = iter_entry_points()
        except Exception as exc:  # corrupt metadata somewhere on sys.path
            self.plugins.append(PluginInfo("<discovery>", GROUP, "?", "?", BROKEN, _describe(exc)))
            return
        for ep in eps:
            dist = ep.dist
            info = PluginInfo(ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?")
            self.plugins.append(info)
            reason = disabled_reason(info.entry_point, info.distribution, self.env)
            if reason:
                info.status, info.error = DISABLED, reason
                continue
            problem = requirement_problem(dist)
            if problem:
                info.status, info.error = INCOMPATIBLE, problem
                continue
            try:
                obj = ep.load()
            except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt-free plugins only
                if isinstance(exc, KeyboardInterrupt):
                    raise
                info.status, info.error = BROKEN, f"import of {ep.value} failed: {_describe(exc)}"
                continue
            self._add(info, obj)

    def register(self, plugin: Any, *, name: str, distribution: str = "<in-process>", version: str = "0") -> PluginInfo:
        """Register an object or module carrying hookimpls, with the same checks as an
        entry point (used by tests and by code that ships plugins without an install)."""
        info = PluginInfo(name, getattr(plugin, "__name__", repr(plugin)), distribution, version)
        self.plugins.append(info)
        self._add(info, plugin)
        return info

    def _add(self, info: PluginInfo, obj: Any) -> None:
        try:
            unknown = [a for a in dir(obj) if a.startswith("rlweave_") and callable(getattr(obj, a, None))
                       and a not in hookspecs.HOOK_KINDS]
            if unknown:
                stems = {h[len("rlweave_"):]: h for h in hookspecs.HOOK_KINDS}
                hint = [stems[m] for m in difflib.get_close_matches(unknown[0][len("rlweave_"):], list(stems), n=1)]
                info.status = BROKEN
                info.error = (f"implements unknown hook {', '.join(unknown)}"
                              + (f" (did you mean {hint[0]}?)" if hint else "")
                              + f"; known hooks: {', '.join(hookspecs.HOOK_KINDS)}")
                return
            self._pm.register(obj, name=f"{info.distribution}:{info.entry_point}")
            info.records = self._call_hooks(obj)
        except Exception as exc:
            info.status, info.error, info.records = BROKEN, _describe(exc), []
            self._unregister(obj)
            return
        wrong = [r for r in info.records if r.api_version != rlweave.PLUGIN_API_VERSION]
        if wrong:
            info.status = INCOMPATIBLE
            info.error = (f"{wrong[0].kind} '{wrong[0].name}' was built for plugin API {wrong[0].api_version}; "
                          f"rlweave {rlweave.__version__} speaks plugin API {rlweave.PLUGIN_API_VERSION}")

    def _unregister(self, obj: Any) -> None:
        try:
            if self._pm.is_registered(obj):
                self._pm.unregister(obj)
        except Exception:
            pass

    def _call_hooks(self, obj: Any) -> list[PluginRecord]:
        records: list[PluginRecord] = []
        for hook_name, kind in hookspecs.HOOK_KINDS.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not obj:
                    continue
                result = impl.function()
                expected = RECORD_TYPES[kind]
                if result is None:
                    continue
                if not isinstance(result, (list, tuple)):
                    raise TypeError(f"{hook_name}() returned {type(result).__name__}, "
                                    f"expected a list of {expected.__name__}")
                for item in result:
                    if not isinstance(item, expected):
                        raise TypeError(f"{hook_name}() returned {type(item).__name__} {item!r:.60}, "
                                        f"expected {expected.__name__}")
                records.extend(result)
        return records

    # ---------------------------------------------------------------- queries
    def availability(self, record: PluginRecord) -> tuple[str, str | None]:
        """``(ok, None)``, ``(unavailable, reason)`` or ``(broken, error)`` from the record's
        ``probe()``, called once per record and manager."""
        cached = self._probed.get(id(record))
        if cached is None or cached[0] is not record:
            try:
                reason = record.probe()
            except Exception as exc:  # a plugin bug: show it, never crash discovery
                status, error = BROKEN, f"probe() of {record.kind} '{record.name}' raised {_describe(exc)}"
            else:
                status, error = (UNAVAILABLE, str(reason)) if reason else (OK, None)
            cached = self._probed[id(record)] = (record, status, error)
        return cached[1], cached[2]

    def providers(self, kind: str | None = None) -> list[Provided]:
        """Every record offered (by ok and incompatible plugins), ``unavailable`` (from its
        probe) and ``conflict`` (among usable records) marked."""
        out = []
        for p in self.plugins:
            for r in p.records:
                if kind is None or r.kind == kind:
                    status, error = self.availability(r) if p.status == OK else (p.status, p.error)
                    out.append(Provided(r, p, status, error))
        for a in out:
            rivals = [b for b in out if b is not a and b.status in (OK, CONFLICT) and (b.kind, b.name) == (a.kind, a.name)]
            if a.status == OK and rivals:
                a.status = CONFLICT
                a.error = "also offered by " + ", ".join(b.plugin.provider for b in rivals)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per record, plus one per plugin that offered none (broken, disabled...)."""
        rows = [p.as_dict() for p in self.providers()]
        for info in self.plugins:
            if not info.records:
                rows.append({"name": info.entry_point, "kind": "-", "distribution": info.distribution,
                             "version": info.version, "entry_point": info.entry_point, "status": info.status,
                             "summary": "", "api_version": None, "error": info.error})
        return rows

    def distributions(self) -> dict[str, str]:
        """Installed plugin distributions -> version (for the run directory's plugins.json)."""
        return {p.distribution: p.version for p in self.plugins}

    def names(self, kind: str) -> list[str]:
        """Names usable in YAML for this kind (ok plugins only)."""
        return sorted({p.name for p in self.providers(kind) if p.status in (OK, CONFLICT)})

    def get(self, kind: str, name: str, where: str | None = None) -> PluginRecord:
        """Return the record selected by ``name``, or raise a :class:`PluginError` saying why not.

        ``where`` names the place of the selection (``"config.yaml: roles.policy.backend"``)
        and is shown in the message.
        """
        label = KIND_LABELS.get(kind, kind)
        loc = f" ({where})" if where else ""
        if kind not in KIND_LABELS:
            raise UnknownPluginError(f"unknown plugin kind '{kind}'{loc}; kinds: {', '.join(KIND_LABELS)}")
        offered = self.providers(kind)
        matches = [p for p in offered if p.name == name]
        usable = [p for p in matches if p.status in (OK, CONFLICT)]
        if len(usable) > 1:
            who = " and ".join(p.plugin.provider for p in usable)
            raise PluginConflictError(
                f"{label} '{name}'{loc} is offered by more than one plugin: {who}. Uninstall one of them, "
                f"or block one with RLWEAVE_DISABLE_PLUGINS=<distribution>.")
        if usable:
            return usable[0].record
        if matches:
            m = next((p for p in matches if p.status == UNAVAILABLE), matches[0])
            if m.status == UNAVAILABLE:
                at = f"; {where}" if where else ""
                raise PluginUnavailableError(f"{label} '{name}' ({m.plugin.provider}{at}) is unavailable here: {m.error}")
            raise PluginUnavailableError(f"{label} '{name}'{loc} comes from {m.plugin.provider}, which is "
                                         f"{m.status}: {m.error}")
        failed = [i for i in self.plugins if i.status != OK and not i.records]
        for info in failed:
            if canonical(info.entry_point) == canonical(name):
                raise PluginUnavailableError(f"{label} '{name}'{loc}: plugin '{info.entry_point}' "
                                             f"({info.provider}) is {info.status}: {info.error}")
        raise UnknownPluginError(self._unknown_message(label, name, loc, offered, failed))

    def _unknown_message(self, label: str, name: str, loc: str, offered: Iterable[Provided],
                         failed: list[PluginInfo]) -> str:
        offered = sorted(offered, key=lambda p: p.name)
        if offered:
            msg = f"unknown {label} '{name}'{loc}. Choose one of: " + ", ".join(
                f"{p.name} ({p.plugin.provider}{'' if p.status == OK else ', ' + p.status})" for p in offered) + "."
        else:
            msg = f"unknown {label} '{name}'{loc}. No {label} plugin is installed."
        close = difflib.get_close_matches(name, sorted({p.name for p in offered}), n=1, cutoff=0.6)
        if close:
            msg += f" Did you mean '{close[0]}'?"
        if failed:
            msg += " Not loaded (may provide it): " + "; ".join(
                f"{i.entry_point} ({i.provider}, {i.status}: {i.error})" for i in failed) + "."
        return msg


@functools.lru_cache(maxsize=1)
def get_plugin_manager() -> PluginManager:
    """The process-wide manager over installed entry points (discovered once).

    Call ``get_plugin_manager.cache_clear()`` after changing the environment variables.
    """
    return PluginManager()
