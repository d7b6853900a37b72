"""The ``rlweave`` command line.

* ``rlweave list-plugins [--json]``: every installed plugin and record with its status
  (``unavailable`` records with the reason their probe gives); never fails because of a plugin.
* ``rlweave validate CONFIG [key.path=value ...] [--schema-only]``: both validation passes
  and the input checks (model directories, data files, a dry run of each reward); prints a
  summary, or every error of all of them and exits with code 2. ``--schema-only`` checks
  the config alone (e.g. an example whose model an earlier stage builds).
* ``rlweave train CONFIG [key.path=value ...] [--resume[=required] | --overwrite] [--address ADDR]
  [--run-dir DIR]``: validates first, inputs included (exit 2 on errors, before anything heavy); then, before
  anything is written, protects an earlier run (:mod:`rlweave.runner.previous_run`): a run
  directory that already holds a run (complete checkpoints past step 0, metrics of trained
  steps, ``hf/``, ``summary.json``) makes it exit 2 naming what is there and the choices
  (``--resume``, a new ``run.name=...``, ``--overwrite``); ``--overwrite`` renames that run to
  ``<name>.replaced-<UTC time>`` (never deletes) and starts fresh; ``--resume`` with no
  complete checkpoint says so on the first line and starts from step 0, ``--resume=required``
  exits 2 instead; ``--resume`` with ``--overwrite`` exits 2. Then it writes the run
  directory's ``config.resolved.yaml`` and ``plugins.json`` and calls
  ``rlweave.runner.loop.run(cfg, config_path=..., run_dir=..., resume=..., overwrite=...)``.

* ``rlweave generate``, ``rlweave export``, ``rlweave eval``: offline generation, checkpoint export
  and evaluation of a trained model (:mod:`rlweave.commands`).
* ``rlweave show RUN_DIR`` and ``rlweave compare RUN_DIR...``: runs read back, alone or side by
  side (:mod:`rlweave.commands.runs`).
* ``rlweave stacks RUN_DIR``: the Python stacks of every live rank of a run on this machine
  (:mod:`rlweave.commands.stacks`); a call past its timeout shows its ranks' stacks by itself.
An invalid config prints one line per problem (``invalid config: <file>: <key>: <message>`` for
one), unknown names and bad references to the user's own code included. User code that fails
inside a run (an environment's ``step()``, a reward failing too often) ends it with one ``error:``
line naming it, its key, the record and ``<run_dir>/logs/errors.log``, which holds the traceback.
Exit codes: 0 ok, 1 run failure / not implemented, 2 invalid config or usage, or a missing dependency
(one line naming the package to install, :mod:`rlweave.deps`; ``train`` checks torch,
transformers and, unless ``run.scheduler`` is in_process, ray before it writes anything), 128+N stopped by signal N (SIGTERM: 143, SIGINT: 130)
after a clean shut-down.
This module imports no torch or ray; the runner is imported only by ``train``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, List, Optional

import click
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand

import rlweave
from rlweave.commands import evaluate as _evaluate
from rlweave.commands import export as _export
from rlweave.commands import generate as _generate
from rlweave.commands import plugins
from rlweave.commands import runs as _runs
from rlweave.commands import stacks as _stacks
from rlweave.deps import check_installed, missing_dependency
from rlweave.interfaces.failures import PluginCodeError
from rlweave.scheduler.worker_log import VERBOSE_ENV
from rlweave.rewards.failures import RewardFailureError
from rlweave.runner.shared_fs import SharedFilesystemError
from rlweave.weight_sync.interface import WeightSyncError
from rlweave.worker_errors import WorkerError, WorkerTimeout

#: how a run can end because of its workers or rewards (printed as one error, exit code 1)
_RUN_FAILURES = (WorkerError, WorkerTimeout, WeightSyncError, RewardFailureError, SharedFilesystemError)
#: what every run imports (the plugins it selects may need more: :func:`main` names those); Ray
#: only with ``run.scheduler: ray``
_RUN_NEEDS = ("torch", "transformers")

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="rlweave: LLM post-training built from plugins.")
STATUS_STYLE = {"ok": "green", "broken": "red", "incompatible": "yellow", "disabled": "dim", "conflict": "magenta",
                "unavailable": "cyan"}


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
        rows = plugins.plugin_manager().rows()
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
        summary = r["summary"] + (" (takes vision-language models)" if r.get("vision") else "")
        if r["status"] != "ok" and r.get("error"):
            summary = f"{summary} — {r['error']}" if summary else r["error"]
        table.add_row(Text(r["name"]), Text(r["kind"]), Text(r["distribution"]), Text(str(r["version"])),
                      Text(r["status"], style=STATUS_STYLE.get(r["status"], "")), Text(summary))
    Console(width=max(Console().width, 140)).print(table)


def _load(config: Path, overrides: List[str], check_inputs: bool = True) -> tuple[Any, Any, Any]:
    """Validate or exit 2 printing every error (plain text on stderr)."""
    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    pm = plugins.plugin_manager()
    try:
        cfg, resolved = load_config(config, overrides, pm, check_inputs=check_inputs)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    for warning in resolved.warnings:
        typer.echo(f"warning: {warning}", err=True)
    return cfg, resolved, pm


def _summary(cfg: Any, resolved: Any) -> str:
    algo = resolved.algorithm
    lines = [f"algorithm: {algo.name} ({', '.join(resolved.role_names) or 'no roles'})" if algo else "algorithm: -"]
    views = getattr(resolved, "views", {})
    for role, rec in resolved.roles.items():
        if role in views:
            continue
        section = cfg.roles[role]
        lines.append(f"role {role}: {rec.kind} {rec.name}, pool {section.pool}, devices {section.devices}"
                     + (f", parallel {section.parallel}" if section.parallel else "")
                     + (f", LoRA r={section.lora.r}" if section.lora is not None else ""))
    for role, source in views.items():
        lines.append(f"role {role}: the {source} with its LoRA adapters disabled (no ranks of its own)")
    for entry, rec in zip(cfg.rewards, resolved.rewards):
        lines.append(f"reward {entry.name} (weight {entry.weight})" + ("" if rec else " [user function]"))
    for name in resolved.kernels:
        roles = [r for r, names in resolved.role_kernels.items() if name in names]
        lines.append(f"kernel {name} ({', '.join(roles)})")
    return "\n".join(lines)


@app.command()
def validate(config: Path = typer.Argument(..., help="Run config YAML."),
             overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides."),
             schema_only: bool = typer.Option(False, "--schema-only",
                                              help="Check the config alone: not model directories, data files "
                                                   "or the rewards' dry run.")) -> None:
    """Validate a run config: core sections, each selected plugin's section, and what it reads."""
    cfg, resolved, _ = _load(config, overrides or [], check_inputs=not schema_only)
    typer.echo(f"OK: {config}")
    typer.echo(_summary(cfg, resolved))


class _TrainCommand(TyperCommand):
    """``--resume`` is a flag that also takes ``=required``; a click option cannot be both, so a
    bare ``--resume`` (before any ``--``) is read as ``--resume=`` (an empty value)."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        out: List[str] = []
        for i, arg in enumerate(args):
            if arg == "--":
                out.extend(args[i:])
                break
            out.append("--resume=" if arg == "--resume" else arg)
        return super().parse_args(ctx, out)


def _resume_mode(value: Optional[str]) -> bool | str:
    """``--resume`` value -> ``False``, ``True`` or ``"required"``; anything else exits 2."""
    if value is None:
        return False
    if value in ("", "required"):
        return value or True
    typer.echo(f"error: --resume takes no value or '=required', got --resume={value}", err=True)
    raise typer.Exit(2)


@app.command(cls=_TrainCommand)
def train(config: Path = typer.Argument(..., help="Run config YAML."),
          overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides."),
          resume: Optional[str] = typer.Option(
              None, "--resume", metavar="[=required]",
              help="Continue from the run directory's latest complete checkpoint (none: say so on the first "
                   "line and start from step 0). --resume=required: exit 2 when there is none."),
          overwrite: bool = typer.Option(
              False, "--overwrite", help="The run directory holds an earlier run: move it aside to "
                                         "<name>.replaced-<UTC time> (never deleted) and start fresh."),
          address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster (sets ray.address)."),
          run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory (default: <run.output_dir>/<run.name>)."),
          verbose: bool = typer.Option(False, "--verbose", help="Show every rank's own output (engines, backends) "
                                                                "on the console instead of in <run_dir>/logs."),
          ) -> None:
    """Validate, then run the configured algorithm."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    mode = _resume_mode(resume)
    if mode and overwrite:
        typer.echo("error: --resume and --overwrite exclude each other: --resume continues the run in the run "
                   "directory, --overwrite moves it aside and starts fresh", err=True)
        raise typer.Exit(2)
    cfg, resolved, pm = _load(config, list(overrides or []))
    if address is not None:
        if cfg.run.scheduler != "ray":
            typer.echo(f"error: --address joins a Ray cluster, but {config}: run.scheduler is "
                       f"{cfg.run.scheduler!r} (no Ray); drop --address or use run.scheduler=ray", err=True)
            raise typer.Exit(2)
        cfg.ray.address = address
    target = run_dir if run_dir is not None else Path(cfg.run.output_dir) / cfg.run.name
    # before anything is written; main() prints what to install
    check_installed((("ray",) if cfg.run.scheduler == "ray" else ()) + _RUN_NEEDS)
    try:
        from rlweave.runner.loop import RunInterrupted, run
    except ImportError as exc:
        if getattr(exc, "name", None) not in ("rlweave.runner", "rlweave.runner.loop"):
            raise
        typer.echo("error: training is not implemented in this rlweave installation "
                   f"(rlweave.runner.loop is missing: {exc})", err=True)
        raise typer.Exit(1) from None
    from rlweave.config.errors import ConfigError
    from rlweave.config.rundir import write_run_dir
    from rlweave.runner.checkpoint import CheckpointError
    from rlweave.runner.previous_run import RunDirError, claim_run_dir

    hint = (lambda p: f"--run-dir {p}") if run_dir is not None else None
    try:  # before anything is written: refuse, or move an earlier run aside (never delete)
        previous = claim_run_dir(target, mode, overwrite, say=typer.echo, new_run_hint=hint)
    except RunDirError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    write_run_dir(target, cfg, pm, resolved)
    typer.echo(f"run directory: {target}")
    try:  # nothing to resume was reported above: the runner starts from step 0 without repeating it
        run(cfg, config_path=config, run_dir=target, resume=mode if previous.last_checkpoint is not None else False,
            overwrite=overwrite)
    except (ConfigError, RunDirError) as exc:  # a check the runner makes late (e.g. a missing data file)
        typer.echo(str(exc) if isinstance(exc, ConfigError) else f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except RunInterrupted as exc:  # workers and Ray are already shut down
        typer.echo(f"interrupted: {exc}; continue with --resume from the latest complete checkpoint", err=True)
        raise typer.Exit(128 + exc.signum) from None
    except CheckpointError as exc:  # damaged, unverifiable or unsafe checkpoint: nothing of it was used
        typer.echo(f"error: {exc}", err=True)
        typer.echo(f"the checkpoints in {target / 'checkpoints'} are left as they are; put back intact copies of the "
                   "files named above, or start a fresh run (in another run directory, or with --overwrite)", err=True)
        raise typer.Exit(1) from None
    except PluginCodeError as exc:  # an environment's step() raised...; all is shut down already
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except _RUN_FAILURES as exc:  # a dead, hung or failing worker, or failing rewards; all is shut down already
        missing = missing_dependency(exc)
        if missing is not None:  # a worker could not import a package: main() names it
            raise missing from None
        typer.echo(f"error: {exc}", err=True)
        typer.echo("the run stopped and every worker is shut down; the latest complete checkpoint is intact "
                   "(continue from it with --resume)", err=True)
        raise typer.Exit(1) from None


# generate, export, eval: commands that use a trained model (rlweave.commands; light at import)
app.command("generate")(_generate.generate)
app.command("export")(_export.export)
app.command("eval")(_evaluate.evaluate)
app.command("stacks")(_stacks.stacks)
app.command("show")(_runs.show)
app.command("compare")(_runs.compare)


def main() -> None:
    """Console-script entry point (``rlweave = rlweave.cli:main``).

    A package missing anywhere in a command, here or on a worker
    (:func:`rlweave.deps.missing_dependency`), ends it with one line naming what to install,
    ``rlweave: this run needs 'vllm' (pip install ...)``, and exit code 2; no traceback."""
    try:
        app(prog_name="rlweave")
    except Exception as exc:
        missing = missing_dependency(exc)
        if missing is None:
            raise
        typer.echo(f"rlweave: {missing}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    sys.exit(main())
