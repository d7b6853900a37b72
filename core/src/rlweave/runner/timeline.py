"""The run's timeline as a picture: which role (and rank) is busy when.

:func:`draw_timeline` reads the spans of :data:`rlweave.scheduler.trace.TRACE` (or any list of
the same dicts) and draws one row per track and rank (the controller's phases first, then
each role's ranks), one colour per span name, time in seconds from the first span. In
``one_step_off`` and ``async`` runs the rollout engine's ``generate`` bars lie under the
policy's ``train_step`` bars: the overlap. Imports matplotlib when called (Agg backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from rlweave.scheduler.trace import CONTROLLER, ROW_NAMES

#: the most bars drawn; a longer run shows its last ones (the trace keeps them all)
MAX_BARS = 20_000


def draw_timeline(spans: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Draw ``spans`` (``track``, ``rank``, ``name``, ``start``, ``end``) to ``path`` (PNG);
    returns it, or None when there is nothing to draw."""
    if not spans:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = sorted(spans, key=lambda s: s["start"])[-MAX_BARS:]
    origin = spans[0]["start"]
    rows = sorted({(s["track"], s["rank"]) for s in spans}, key=lambda r: (r[0] != CONTROLLER, r[0], -r[1]))
    row_of = {r: i for i, r in enumerate(rows)}
    names = sorted({s["name"] for s in spans})
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.8))
    for name in names:
        for (track, rank), y in row_of.items():
            bars = [(s["start"] - origin, max(s["end"] - s["start"], 1e-4)) for s in spans
                    if s["name"] == name and s["track"] == track and s["rank"] == rank]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colour[name], edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{t} {ROW_NAMES.get(r, r)}" if t == CONTROLLER else f"{t} {r}" for t, r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in names]
    ax.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, -0.5 / max(1, len(rows)) - 0.12),
              ncol=min(6, len(names)), fontsize=8, frameon=False)
    ax.set_title(title or "timeline")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
