"""``rlweave stacks RUN_DIR``: where every live rank of a running (or hung) run is now.

Reads ``<run_dir>/workers.json`` (role -> ranks with ``pid``, ``node_ip`` and ``stack_fd``,
written when the roles are up) and prints each rank's Python stacks, every thread, most
recent call first (:mod:`rlweave.scheduler.stacks`). Ranks on another machine are named with
the address to run the command on. Exit codes: 0 printed, 2 no such run or no ranks listed.
Light at import (no torch, no Ray).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlweave.scheduler import stacks as _stacks


def stacks(run_dir: Path = typer.Argument(..., help="The run directory (holds workers.json).")) -> None:
    """Print the Python stacks of every live rank of a run (on this machine)."""
    path = run_dir / "workers.json"
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        typer.echo(f"error: {path}: no such file (is {run_dir} a run directory whose roles have started?)", err=True)
        raise typer.Exit(2) from None
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {path}: cannot be read: {exc}", err=True)
        raise typer.Exit(2) from None
    ranks = [(role, row) for role, role_rows in rows.items() if isinstance(role_rows, list) for row in role_rows]
    if not ranks:
        typer.echo(f"error: {path}: lists no ranks", err=True)
        raise typer.Exit(2)
    for role, row in ranks:
        typer.echo(f"=== {role} rank {row.get('rank')} (pid {row.get('pid')}, node {row.get('node_ip')}) ===")
        typer.echo(_stacks.dump(_stacks.StackSource.from_dict(row)))
        typer.echo("")
