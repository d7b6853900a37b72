"""The run directory's record of what ran: resolved config and plugin versions.

``write_run_dir(run_dir, cfg, pm)`` writes

* ``config.resolved.yaml``: the validated config, every default and plugin section filled in
  (loading it again gives the same run);
* ``plugins.json``: ``{"rlweave": version, "plugin_api_version": n, "python": ...,
  "plugins": [{entry_point, distribution, version, status, error, records: [{kind, name}]}],
  "selected": {...}, "models": {...}}`` for every installed plugin (``selected`` only when
  ``resolved`` is given; ``models`` only when the config names hub models: per dotted key the
  hub name, the configured revision and the commit hash of the cached snapshot used,
  :func:`rlweave.config.hub.resolved_models`; for GGUF files, added by :func:`record_gguf` once
  the runner has converted them: the file, its sha256 and the converted directory used).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import yaml

import rlweave
from rlweave.config.hub import resolved_models
from rlweave.config.resolve import ResolvedPlugins
from rlweave.config.schema import RunConfig
from rlweave.plugins.manager import PluginManager


def plugins_report(pm: PluginManager, resolved: ResolvedPlugins | None = None) -> dict[str, Any]:
    """The content of ``plugins.json`` (see the module docstring)."""
    report: dict[str, Any] = {
        "rlweave": rlweave.__version__,
        "plugin_api_version": rlweave.PLUGIN_API_VERSION,
        "python": platform.python_version(),
        "plugins": [
            {"entry_point": p.entry_point, "distribution": p.distribution, "version": p.version,
             "status": p.status, "error": p.error,
             "records": [{"kind": r.kind, "name": r.name} for r in p.records]}
            for p in pm.plugins
        ],
    }
    if resolved is not None:
        report["selected"] = {
            "algorithm": resolved.algorithm.name if resolved.algorithm else None,
            "roles": {role: {"kind": rec.kind, "name": rec.name} for role, rec in resolved.roles.items()},
            "rewards": [r.name if r else None for r in resolved.rewards],
            "kernels": sorted(resolved.kernels),
            "run_mode": resolved.run_mode.name if resolved.run_mode else None,
            "rollout": resolved.rollout.name if resolved.rollout else None,
        }
    return report


def write_run_dir(run_dir: str | os.PathLike[str], cfg: RunConfig, pm: PluginManager,
                  resolved: ResolvedPlugins | None = None) -> Path:
    """Create ``run_dir`` (and parents) and write both files; returns the directory."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    (path / "config.resolved.yaml").write_text(text, encoding="utf-8")
    report = plugins_report(pm, resolved)
    models = resolved_models(cfg)
    if models:
        report["models"] = models
    (path / "plugins.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path


def record_gguf(run_dir: str | os.PathLike[str], found: dict[str, Path]) -> None:
    """Add the GGUF conversions a run uses (``{dotted key: converted directory}``, from
    :func:`rlweave.config.gguf_convert.localize_gguf`) to ``plugins.json``'s ``models``:
    ``{"gguf": file, "sha256": ..., "path": converted directory}`` per key."""
    from rlweave.config.gguf import read_record

    if not found:
        return
    path = Path(run_dir) / "plugins.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a run started without write_run_dir: nothing to add to
        return
    models = report.setdefault("models", {})
    for key, hf in found.items():
        record = read_record(Path(hf).parent) or {}
        models[key] = {"gguf": record.get("source"), "sha256": record.get("sha256"), "path": str(hf)}
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
