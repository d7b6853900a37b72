"""The ``rlweave`` command line.

* ``rlweave list-plugins [--json]``: every installed plugin and record with its status;
  never fails because of a plugin.
* ``rlweave validate CONFIG [key.path=value ...]``: both validation passes; prints a
  summary, or every error and exits with code 2.
* ``rlweave train CONFIG [key.path=value ...] [--resume] [--address ADDR] [--run-dir DIR]``:
  validates first (exit 2 on errors, before anything heavy), writes the run directory's
  ``config.resolved.yaml`` and ``plugins.json``, then calls
  ``rlweave.runner.loop.run(cfg, config_path=..., run_dir=..., resume=...)``.

Exit codes: 0 ok, 1 run failure / not implemented, 2 invalid config or usage, 128+N stopped by
signal N (SIGTERM: 143, SIGINT: 130) after a clean shut-down.
This module imports no torch or ray; the runner is imported only by ``train``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

import rlweave

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="rlweave: LLM post-training built from plugins.")
STATUS_STYLE = {"ok": "green", "broken": "red", "incompatible": "yellow", "disabled": "dim", "conflict": "magenta"}


def plugin_manager() -> Any:
    """The plugin manager the commands use (tests may replace this function)."""
    from rlweave.plugins.manager import get_plugin_manager

    return get_plugin_manager()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlweave {rlweave.__version__} (plugin API {rlweave.PLUGIN_API_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Show the version and exit.")) -> None:
    """rlweave: LLM post-training built from plugins."""


@app.command("list-plugins")
def list_plugins(as_json: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table.")) -> None:
    """List installed plugins: name, kind, distribution, version, status, summary."""
    try:
        rows = plugin_manager().rows()
    except Exception as exc:  # a bug in discovery itself: still answer
        rows = [{"name": "<discovery>", "kind": "-", "distribution": "?", "version": "?", "entry_point": "-",
                 "status": "broken", "summary": "", "api_version": None, "error": f"{type(exc).__name__}: {exc}"}]
    rows.sort(key=lambda r: (r["kind"] == "-", r["kind"], r["name"], r["distribution"]))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="rlweave plugins")
    for col in ("name", "kind", "distribution", "version", "status", "summary"):
        table.add_column(col, overflow="fold")
    for r in rows:
        summary = r["summary"]
        if r["status"] != "ok" and r.get("error"):
            summary = f"{summary} — {r['error']}" if summary else r["error"]
        table.add_row(Text(r["name"]), Text(r["kind"]), Text(r["distribution"]), Text(str(r["version"])),
                      Text(r["status"], style=STATUS_STYLE.get(r["status"], "")), Text(summary))
    Console(width=max(Console().width, 140)).print(table)


def _load(config: Path, overrides: List[str]) -> tuple[Any, Any, Any]:
    """Validate or exit 2 printing every error (plain text on stderr)."""
    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    pm = plugin_manager()
    try:
        cfg, resolved = load_config(config, overrides, pm)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    for warning in resolved.warnings:
        typer.echo(f"warning: {warning}", err=True)
    return cfg, resolved, pm


def _summary(cfg: Any, resolved: Any) -> str:
    algo = resolved.algorithm
    lines = [f"algorithm: {algo.name} ({', '.join(resolved.role_names) or 'no roles'})" if algo else "algorithm: -"]
    for role, rec in resolved.roles.items():
        section = cfg.roles[role]
        lines.append(f"role {role}: {rec.kind} {rec.name}, pool {section.pool}, devices {section.devices}"
                     + (f", parallel {section.parallel}" if section.parallel else ""))
    for entry, rec in zip(cfg.rewards, resolved.rewards):
        lines.append(f"reward {entry.name} (weight {entry.weight})" + ("" if rec else " [user function]"))
    for name in resolved.kernels:
        lines.append(f"kernel {name}")
    return "\n".join(lines)


@app.command()
def validate(config: Path = typer.Argument(..., help="Run config YAML."),
             overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides.")) -> None:
    """Validate a run config (core sections and each selected plugin's section)."""
    cfg, resolved, _ = _load(config, overrides or [])
    typer.echo(f"OK: {config}")
    typer.echo(_summary(cfg, resolved))


@app.command()
def train(config: Path = typer.Argument(..., help="Run config YAML."),
          overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides."),
          resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's latest checkpoint."),
          address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster (sets ray.address)."),
          run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory (default: <run.output_dir>/<run.name>)."),
          ) -> None:
    """Validate, then run the configured algorithm."""
    cfg, resolved, pm = _load(config, list(overrides or []))
    if address is not None:
        cfg.ray.address = address
    target = run_dir if run_dir is not None else Path(cfg.run.output_dir) / cfg.run.name
    try:
        from rlweave.runner.loop import RunInterrupted, run
    except ImportError as exc:
        if getattr(exc, "name", None) not in ("rlweave.runner", "rlweave.runner.loop"):
            raise
        typer.echo("error: training is not implemented in this rlweave installation "
                   f"(rlweave.runner.loop is missing: {exc})", err=True)
        raise typer.Exit(1) from None
    from rlweave.config.rundir import write_run_dir

    from rlweave.config.errors import ConfigError

    write_run_dir(target, cfg, pm, resolved)
    typer.echo(f"run directory: {target}")
    try:
        run(cfg, config_path=config, run_dir=target, resume=resume)
    except ConfigError as exc:  # a check the runner makes late (e.g. a missing data file)
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    except RunInterrupted as exc:  # workers and Ray are already shut down
        typer.echo(f"interrupted: {exc}; continue with --resume from the latest complete checkpoint", err=True)
        raise typer.Exit(128 + exc.signum) from None


def main() -> None:
    """Console-script entry point (``rlweave = rlweave.cli:main``)."""
    app(prog_name="rlweave")


if __name__ == "__main__":
    sys.exit(main())
