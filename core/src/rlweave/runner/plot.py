"""PNG plot of a run's metrics: one panel per key against the step (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from rlweave.runner.metrics import read_metrics


def plot_metrics(jsonl_path: str | Path, png_path: str | Path, keys: list[str], title: str | None = None) -> Path:
    """Draw ``keys`` of ``metrics.jsonl`` (one subplot each, x = step) into ``png_path``.

    Rows without a key (e.g. evaluation every k steps) are skipped for that key; a key with
    no values at all gets an empty panel saying so. Returns the PNG path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not keys:
        raise ValueError("plot_metrics: no keys to plot")
    rows = read_metrics(jsonl_path)
    fig = Figure(figsize=(6.4, 2.4 * len(keys)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and "step" in r]
        if pts:
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o" if len(pts) <= 30 else None, markersize=3)
        else:
            ax.text(0.5, 0.5, f"no data for {key!r}", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(png_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
