"""The run's timeline: spans of the controller's phases and of every rank call, as a
Chrome/Perfetto trace.

:data:`TRACE` is this process's recorder, off until :meth:`Trace.start`. While it is on:

* every rank call of every role (``generate``, ``compute_logprobs``, ``train_step``, weight
  loading...) becomes a span on the role's track, one row per rank, timed where it ran (the
  rank measures its own call, :class:`Timed`; wall clock, so processes of one machine line up);
* the controller's phases (:meth:`Trace.phase`: ``generate``, ``experience``, ``train``,
  ``sync``, ``eval``) become spans on the ``controller`` track, and each step one on its row
  of steps;
* the reward pool's scoring (track ``rewards``) and the environments' steps of multi-turn
  episodes (track ``environment``, a row per thread of its pool) are spans too;
* every span carries the controller's step (:attr:`Trace.step`) and the policy's weight version
  (:attr:`Trace.version`: updates applied so far) when it was recorded.

:meth:`Trace.write` saves ``{"traceEvents": [...]}`` (complete events, ``ph: "X"``,
microseconds), which ui.perfetto.dev and chrome://tracing open; :mod:`rlweave.runner.timeline`
draws it as a picture. Recording costs a dict per call; at most :data:`MAX_EVENTS` are kept
(later ones are counted in the trace's metadata, not stored). Standard library only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

#: the most spans one run keeps
MAX_EVENTS = 500_000
#: the track of the controller's phases
CONTROLLER = "controller"
#: the controller's rows: its phases, and its steps (each holding phases)
PHASES, STEPS = 0, 1
ROW_NAMES = {PHASES: "phases", STEPS: "steps"}


@dataclass
class Timed:
    """What a rank call returns through the scheduler: its ``value`` and when it ran
    (``start``/``end``: ``time.time()`` seconds in the rank's process)."""

    value: Any
    start: float
    end: float


class Trace:
    """The span recorder (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self.enabled = False
        self.step = 0
        self.version = 0
        self._events: list[tuple[str, int, str, float, float, int, int, dict[str, Any]]] = []
        self._dropped = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Record from now on, starting empty."""
        with self._lock:
            self._events, self._dropped, self.step, self.version, self.enabled = [], 0, 0, 0, True

    def stop(self) -> None:
        """Stop recording (what was recorded stays until the next :meth:`start`)."""
        self.enabled = False

    def span(self, track: str, rank: int, name: str, start: float, end: float, **args: Any) -> None:
        """Record ``name`` on ``track`` (a role, or :data:`CONTROLLER`), row ``rank``, from
        ``start`` to ``end`` (``time.time()`` seconds); ``args`` are shown with it."""
        if not self.enabled:
            return
        with self._lock:
            if len(self._events) >= MAX_EVENTS:
                self._dropped += 1
                return
            self._events.append((track, int(rank), name, float(start), float(end), self.step, self.version, args))

    @contextmanager
    def phase(self, name: str, row: int = PHASES, **args: Any) -> Iterator[None]:
        """A span of the controller around the ``with`` block, on row ``row`` (:data:`PHASES`,
        or :data:`STEPS` for the step itself, which holds phases)."""
        start = time.time()
        try:
            yield
        finally:
            self.span(CONTROLLER, row, name, start, time.time(), **args)

    def wrap(self, track: str, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` recording each call as a span ``name`` on ``track``, on the row of the thread
        it runs on (its index in a thread pool, ``<prefix>_<i>``; 0 elsewhere), when it
        returns or raises."""

        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                tail = threading.current_thread().name.rpartition("_")[2]
                self.span(track, int(tail) if tail.isdigit() else 0, name, start, time.time())

        return run

    def spans(self) -> list[dict[str, Any]]:
        """The recorded spans: ``track``, ``rank``, ``name``, ``start``, ``end``, ``step``,
        ``version``, ``args``."""
        with self._lock:
            events = list(self._events)
        return [{"track": t, "rank": r, "name": n, "start": s, "end": e, "step": st, "version": v, "args": a}
                for t, r, n, s, e, st, v, a in events]

    def chrome(self) -> dict[str, Any]:
        """The spans as a Chrome trace object: one process per track (the controller first), one
        thread per rank, times in microseconds from the first span."""
        spans = self.spans()
        origin = min((s["start"] for s in spans), default=0.0)
        tracks = [CONTROLLER] + sorted({s["track"] for s in spans} - {CONTROLLER})
        pid = {t: i + 1 for i, t in enumerate(tracks)}
        events: list[dict[str, Any]] = []
        for track in tracks:
            events.append({"ph": "M", "name": "process_name", "pid": pid[track], "tid": 0, "args": {"name": track}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid[track], "tid": 0,
                           "args": {"sort_index": pid[track]}})
        for track, rank in sorted({(s["track"], s["rank"]) for s in spans}):
            events.append({"ph": "M", "name": "thread_name", "pid": pid[track], "tid": rank,
                           "args": {"name": f"rank {rank}" if track != CONTROLLER else ROW_NAMES.get(rank, str(rank))}})
        for s in spans:
            events.append({"ph": "X", "name": s["name"], "cat": s["track"], "pid": pid[s["track"]], "tid": s["rank"],
                           "ts": round((s["start"] - origin) * 1e6, 1),
                           "dur": round(max(0.0, s["end"] - s["start"]) * 1e6, 1),
                           "args": {"step": s["step"], "policy_version": s["version"], **s["args"]}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "metadata": {"origin_unix_s": origin, "dropped_spans": self._dropped}}

    def write(self, path: str | Path) -> Path:
        """Write :meth:`chrome` to ``path`` (replaced whole: a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.chrome()))
        os.replace(tmp, path)
        return path


#: this process's recorder
TRACE = Trace()
