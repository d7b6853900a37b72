"""What the plugin manager knows about each entry point and each record it offered.

Statuses (of an entry point, and of each of its records):

* ``ok``: loaded, hooks returned valid records.
* ``broken``: raised on import or in a hook, implements an unknown ``rlweave_*`` hook, or
  a hook returned something that is not a record of its kind.
* ``incompatible``: a record was built for another ``PLUGIN_API_VERSION``, or the
  distribution requires an ``rlweave`` version range this one is outside of.
* ``disabled``: skipped because of ``RLWEAVE_DISABLE_PLUGINS`` / ``RLWEAVE_PLUGINS``.
* ``conflict`` (records only): another plugin offers the same name in the same kind.
* ``unavailable`` (records only): the plugin loaded, but the record's ``probe()`` says it
  cannot run on this machine (not installed, needs CUDA, not implemented yet...); ``error``
  holds that reason. A probe that raises makes the record ``broken``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlweave.plugins.types import PluginRecord

OK, BROKEN, INCOMPATIBLE, DISABLED, CONFLICT = "ok", "broken", "incompatible", "disabled", "conflict"
UNAVAILABLE = "unavailable"

#: record kind -> how a user calls it in messages
KIND_LABELS: dict[str, str] = {
    "backend": "training backend",
    "engine": "inference engine",
    "algorithm": "algorithm",
    "reward": "reward",
    "kernel": "kernel",
    "advantage": "advantage estimator",
    "policy_loss": "policy loss",
    "kl": "KL estimator",
    "loss_agg": "loss aggregation",
    "rollout_correction": "rollout correction",
    "environment": "environment",
    "tool_parser": "tool-call parser",
    "rollout": "rollout",
    "run_mode": "run mode",
}


@dataclass
class PluginInfo:
    """One entry point of the group ``rlweave.plugins`` (or one in-process registration).

    ``error`` is the reason for a non-ok status (e.g. the import traceback's last line).
    ``records`` holds what its hooks returned (empty when broken or disabled).
    """

    entry_point: str
    value: str
    distribution: str
    version: str
    status: str = OK
    error: str | None = None
    records: list[PluginRecord] = field(default_factory=list)

    @property
    def provider(self) -> str:
        """``"<distribution> <version>"``, as shown in messages."""
        return f"{self.distribution} {self.version}".strip()


@dataclass
class Provided:
    """One record as offered by one plugin; ``status`` may also be ``conflict`` or ``unavailable``."""

    record: PluginRecord
    plugin: PluginInfo
    status: str = OK
    error: str | None = None

    @property
    def kind(self) -> str:
        return self.record.kind

    @property
    def name(self) -> str:
        return self.record.name

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready row for ``rlweave list-plugins --json``; backends and engines also say
        whether they take vision-language models (``vision``)."""
        extra = {"vision": bool(getattr(self.record, "vision", False))} if self.kind in ("backend", "engine") else {}
        return {
            "name": self.name,
            "kind": self.kind,
            "distribution": self.plugin.distribution,
            "version": self.plugin.version,
            "entry_point": self.plugin.entry_point,
            "status": self.status,
            "summary": self.record.summary,
            "api_version": self.record.api_version,
            "error": self.error,
            **extra,
        }
