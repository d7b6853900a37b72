"""Console output of a run: a progress bar (tqdm on a terminal) plus one status line per step.

``format_status`` gives ``step 3/50 | reward 0.41 | kl 0.002 | 12.3s (gen 5.1 train 6.0 sync 0.4) | eta 9m40s``:
the fields a step logged (an algorithm without rewards shows no reward), the phases that took at
least :data:`MIN_PHASE_S`, and the time left at the mean pace of the steps this process ran.
On a terminal the bar stays at the bottom and status lines print above it; when the stream
is not a terminal (CI, a log file, ``| tee``) there is no bar, only the status lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: default (label, metrics key) pairs of the status line
DEFAULT_FIELDS: tuple[tuple[str, str], ...] = (
    ("reward", "reward_mean"),
    ("acc", "eval_accuracy"),
    ("kl", "kl"),
    ("loss", "loss"),
)
MISSING = "\u2014"  # em dash
#: phases shorter than this (seconds) are left out of a status line
MIN_PHASE_S = 0.05


def _fmt(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value == 0:
            return "0"
        if abs(value) >= 1000 or abs(value) < 1e-3:
            return f"{value:.2e}"
        return f"{value:.3g}"
    return str(value)


def format_status(
    step: int,
    total: int,
    metrics: dict[str, Any],
    timings: dict[str, float] | None = None,
    fields: tuple[tuple[str, str], ...] | list[tuple[str, str]] = DEFAULT_FIELDS,
    eta_s: float | None = None,
) -> str:
    """One status line. ``fields`` are ``(label, key)``; a key missing from ``metrics`` is left
    out. ``timings`` (phase -> seconds) prints the total and each phase of at least
    :data:`MIN_PHASE_S` in order; ``eta_s`` the time left (:func:`format_duration`)."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {_fmt(metrics[key])}" for label, key in fields if key in metrics]
    if timings:
        total_s = timings.get("total", sum(v for k, v in timings.items() if k != "total"))
        phases = " ".join(f"{k} {v:.1f}" for k, v in timings.items() if k != "total" and v >= MIN_PHASE_S)
        parts.append(f"{total_s:.1f}s ({phases})" if phases else f"{total_s:.1f}s")
    if eta_s is not None:
        parts.append(f"eta {format_duration(eta_s)}")
    return " | ".join(parts)


def format_duration(seconds: float) -> str:
    """``42s``, ``9m40s``, ``2h05m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class PhaseTimer:
    """Wall time per phase of a step: ``with timer.phase("gen"): ...``; ``times()`` returns
    ``{phase: seconds, ..., "total": seconds}`` and ``reset()`` starts the next step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start = time.perf_counter()
        self._times: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._times[name] = self._times.get(name, 0.0) + time.perf_counter() - t0

    def times(self) -> dict[str, float]:
        return {**self._times, "total": time.perf_counter() - self._start}


class Progress:
    """Progress of ``total`` steps on ``stream`` (default stdout).

    ``bar=None`` shows a tqdm bar only when ``stream`` is a terminal. ``update(step, line)``
    moves the bar to ``step`` and prints ``line`` (if given) above it, or alone without a bar.
    """

    def __init__(self, total: int, desc: str = "train", stream: TextIO | None = None, bar: bool | None = None,
                 initial: int = 0) -> None:
        self.stream = stream or sys.stdout
        self.total = total
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self._bar = None
        if bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, initial=initial, file=self.stream, dynamic_ncols=True,
                             leave=True)
        self._n = initial
        self._first = initial
        self._t0 = time.perf_counter()

    def eta(self, step: int) -> float | None:
        """Seconds left after ``step`` at the mean pace of the steps since this object was made
        (``None`` before the first one)."""
        done = step - self._first
        if done <= 0:
            return None
        return (time.perf_counter() - self._t0) / done * max(0, self.total - step)

    def update(self, step: int, line: str | None = None) -> None:
        if self._bar is not None:
            if line:
                self._bar.write(line, file=self.stream)
            self._bar.update(max(0, step - self._n))
        elif line:
            print(line, file=self.stream, flush=True)
        self._n = step

    def rewind(self, step: int) -> None:
        """Move the bar back to ``step`` (a run that went back to an earlier checkpoint)."""
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()
        self._n = self._first = step
        self._t0 = time.perf_counter()

    def write(self, line: str) -> None:
        """Print a line (evaluation results etc.) without breaking the bar."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
