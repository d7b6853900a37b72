"""``rlweave show RUN_DIR`` and ``rlweave compare RUN_DIR...``: runs read back, alone or side by side.

Both only read a run directory (``plugins.json``, ``config.resolved.yaml``, ``metrics.jsonl``,
``summary.json`` and the files beside them); a run still going or stopped is shown as far as
it got. ``show`` prints what ran (algorithm, roles with their backend or engine, run mode,
rewards, steps), the held-out evaluation before and after, the last and best value of each key
metric with its step, and where the run's pictures and models are. ``compare`` prints one table
with a row per run (evaluations, the last reward and loss, the mean seconds per step after the
first) and, with ``--plot FILE``, draws the key metrics of every run overlaid (a
file already there is replaced only with ``--overwrite``). Exit codes: 0 shown, 2 a path that
is not a run directory (one line naming it). Light at import (matplotlib when drawing).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from rlweave.runner.metrics import read_metrics

#: the metrics shown, and whether a higher value is better (None: neither)
KEYS: dict[str, bool | None] = {
    "eval/accuracy": True, "reward/mean": True, "loss": None, "kl": None, "entropy": None,
    "response_len/mean": None, "logprob_gap": False, "grad_norm": None, "time/step": False,
}


class Run:
    """What a run directory holds, read once (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        if not (path / "metrics.jsonl").is_file() and not (path / "plugins.json").is_file():
            raise FileNotFoundError(f"{path}: not a run directory (no metrics.jsonl or plugins.json)")
        self.rows = [r for r in read_metrics(path / "metrics.jsonl") if isinstance(r.get("step"), (int, float))]
        self.summary = _json(path / "summary.json")
        self.selected = (_json(path / "plugins.json") or {}).get("selected") or {}

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def steps(self) -> int:
        return int(max((r["step"] for r in self.rows), default=0))

    def series(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of ``key`` over the rows that have it (step 0: the evaluation before)."""
        return [(int(r["step"]), float(r[key])) for r in self.rows if isinstance(r.get(key), (int, float))]

    def last(self, key: str) -> tuple[int, float] | None:
        points = [p for p in self.series(key) if p[0] >= 1 or key.startswith("eval/")]
        return points[-1] if points else None

    def best(self, key: str) -> tuple[int, float] | None:
        higher = KEYS.get(key)
        points = [p for p in self.series(key) if p[0] >= 1]
        if higher is None or not points:
            return None
        return (max if higher else min)(points, key=lambda p: p[1])

    def step_seconds(self) -> float | None:
        """Mean ``time/step`` over the steps after the first (which includes warm-up), or the
        first's when it is the only one."""
        points = [v for s, v in self.series("time/step") if s >= 1]
        later = points[1:] or points
        return sum(later) / len(later) if later else None

    def eval_at(self, which: str) -> float | None:
        """``eval/accuracy`` before (``"before"``) or after (``"after"``) training, where known."""
        ev = (self.summary or {}).get(f"eval_{which}") or {}
        if "eval/accuracy" in ev:
            return float(ev["eval/accuracy"])
        points = self.series("eval/accuracy")
        if which == "before":
            return next((v for s, v in points if s == 0), None)
        return points[-1][1] if points and points[-1][0] >= 1 else None

    def status(self) -> str:
        if self.summary is not None:
            return f"finished: {self.steps} steps in {_duration(self.summary.get('wall_s'))}"
        return f"not finished: {self.steps} step(s) logged"

    def what_ran(self) -> str:
        sel = self.selected
        roles = ", ".join(f"{r} {v.get('name')}" for r, v in (sel.get("roles") or {}).items())
        parts = [sel.get("algorithm") or "?", f"mode {sel.get('run_mode', 'sync')}", roles,
                 "rewards " + ", ".join(sel.get("rewards") or []) if sel.get("rewards") else ""]
        return " | ".join(p for p in parts if p)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "?"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _fmt(v: float | None, key: str = "") -> str:
    if v is None:
        return "—"
    if key.endswith("accuracy"):
        return f"{v * 100:.1f}%"
    return f"{v:.4g}"


def _open(paths: List[Path]) -> list[Run]:
    runs = []
    for p in paths:
        try:
            runs.append(Run(p))
        except FileNotFoundError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    return runs


def show(run_dir: Path = typer.Argument(..., help="A run directory (runs/<name>).")) -> None:
    """What a run did: config, evaluations, last and best metrics, its files."""
    (run,) = _open([run_dir])
    console = Console(width=max(Console().width, 100))
    console.print(f"[bold]{run.path}[/bold]: {run.status()}")
    console.print(run.what_ran())
    before, after = run.eval_at("before"), run.eval_at("after")
    if before is not None or after is not None:
        console.print(f"held-out accuracy: {_fmt(before, 'accuracy')} before -> {_fmt(after, 'accuracy')} after")
    table = Table(title="metrics")
    for col in ("metric", "last", "at step", "best", "at step"):
        table.add_column(col)
    for key in KEYS:
        last, best = run.last(key), run.best(key)
        if last is None:
            continue
        table.add_row(key, _fmt(last[1], key), str(last[0]), _fmt(best[1], key) if best else "—",
                      str(best[0]) if best else "—")
    console.print(table)
    files = [n for n in ("metrics.png", "timeline.png", "trace.json", "hf", "checkpoints", "logs")
             if (run.path / n).exists()]
    if files:
        console.print("files: " + ", ".join(str(run.path / n) for n in files))


def compare(run_dirs: List[Path] = typer.Argument(..., help="Two or more run directories."),
            plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the key metrics of every run to this PNG."),
            keys: Optional[List[str]] = typer.Option(None, "--key", help="A metric to compare (repeatable)."),
            overwrite: bool = typer.Option(False, "--overwrite", help="Replace the --plot file if it exists.")) -> None:
    """Runs side by side: one table, and their metrics overlaid in one picture."""
    if len(run_dirs) < 2:
        typer.echo("error: compare takes two or more run directories", err=True)
        raise typer.Exit(2)
    if plot is not None and plot.exists() and not overwrite:
        typer.echo(f"error: {plot} exists; choose another --plot file or add --overwrite", err=True)
        raise typer.Exit(2)
    runs = _open(run_dirs)
    chosen = list(keys) if keys else [k for k in ("reward/mean", "loss") if any(r.last(k) for r in runs)]
    table = Table(title="runs")
    for col in ["run", "steps", "eval before", "eval after"] + [f"{k} (last)" for k in chosen] + ["s/step"]:
        table.add_column(col)
    for r in runs:
        table.add_row(r.name, str(r.steps), _fmt(r.eval_at("before"), "accuracy"), _fmt(r.eval_at("after"), "accuracy"),
                      *[_fmt((r.last(k) or (0, None))[1], k) for k in chosen], _fmt(r.step_seconds()))
    Console(width=max(Console().width, 100)).print(table)
    if plot is not None:
        drawn = list(keys) if keys else [k for k in ("reward/mean", "eval/accuracy", "loss")
                                          if any(r.series(k) for r in runs)]
        typer.echo(f"plot: {draw_comparison(runs, drawn, plot)}")


def draw_comparison(runs: list[Run], keys: list[str], path: Path) -> Path:
    """One panel per key, one line per run (x: step), into ``path`` (PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, 2.4 * max(1, len(keys))), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(keys)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys):
        for run in runs:
            points = run.series(key)
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(points) <= 30 else None, markersize=3, label=run.name)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
