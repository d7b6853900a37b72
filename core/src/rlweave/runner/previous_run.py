"""An earlier run in a run directory is never deleted or overwritten without an explicit flag.

:func:`claim_run_dir` is the one rule, applied by ``rlweave train`` (after validation, before it
writes anything or starts any worker) and again by :func:`rlweave.runner.loop.run` (before it
touches the directory), so Python callers get the same protection.

What counts as a run (:attr:`PreviousRun.is_run`): anything a trained step or a finished run
made: a complete checkpoint past step 0, a ``metrics.jsonl`` row for a step >= 1, ``hf/``
(not empty), ``summary.json``. What does not: ``config.resolved.yaml``, ``plugins.json`` and
``workers.json`` (every start rewrites them), and what a start that trained no step left behind
(``metrics.jsonl`` with step-0 rows only, ``tensorboard/``, a step-0 checkpoint, partial saves,
the timeline of a failed start).
Such a directory does not block a retry; those leftovers (when ``workers.json`` shows that a
start wrote them) are moved into ``<run_dir>/earlier-starts/<UTC time>/`` so that the new run's
metrics start clean. Files of the user's own in the directory are never moved or rewritten.

The rule, by the caller's ``resume`` and ``overwrite``:

* neither, and the directory holds a run: :class:`RunDirError` naming what is there and the
  ways out (resume, a new ``run.name``, overwrite); nothing is changed.
* ``overwrite``, and the directory holds a run: it is renamed to the sibling
  ``<name>.replaced-<UTC time>`` (``-2``, ``-3``, ... when taken), one line says where, and the
  run starts in a new directory.
* ``resume`` and a complete checkpoint: nothing moves; the caller loads it.
* ``resume=True`` and no complete checkpoint: one line says so, and the run starts from step 0;
  but when the directory holds a run (trained steps, no checkpoint) starting over would replace
  it: :class:`RunDirError`. ``resume="required"`` and no complete checkpoint: :class:`RunDirError`.
* ``resume`` with ``overwrite``: :class:`RunDirError` (they contradict each other).

Nothing here deletes a file. Imports only the standard library and light rlweave modules.
"""

from __future__ import annotations

import difflib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rlweave.runner.checkpoint import complete_checkpoints
from rlweave.runner.metrics import read_metrics

#: where :func:`claim_run_dir` puts what a start that trained no step left behind
EARLIER_STARTS = "earlier-starts"
#: runner outputs such a start can leave; moved aside (when not empty) before a fresh start
LEFTOVERS = ("metrics.jsonl", "tensorboard", "checkpoints", "trace.json", "timeline.png")
#: what the checkpoint manager writes under ``checkpoints/``
_CKPT_ENTRY = re.compile(r"^(\.tmp-|\.trash-)?step_\d+$")


class RunDirError(ValueError):
    """The run directory cannot be used as asked: it holds a run a fresh start would replace,
    or nothing to resume under ``resume="required"``, or the flags contradict each other.
    A usage error (``rlweave train`` exits 2); nothing was changed when it is raised."""


class Words(NamedTuple):
    """How messages name the caller's options."""

    resume: str
    required: str
    overwrite: str


CLI_WORDS = Words("--resume", "--resume=required", "--overwrite")
PYTHON_WORDS = Words("resume=True", "resume='required'", "overwrite=True")


@dataclass(frozen=True)
class PreviousRun:
    """What a run directory holds (see the module docstring for what counts as a run)."""

    path: Path
    exists: bool
    checkpoints: tuple[int, ...] = ()  #: steps of the complete checkpoints, oldest first
    metrics_last_step: int | None = None  #: the highest step in ``metrics.jsonl``
    hf: bool = False
    summary: bool = False

    @property
    def last_checkpoint(self) -> int | None:
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def is_run(self) -> bool:
        trained = any(s >= 1 for s in self.checkpoints) or (self.metrics_last_step or 0) >= 1
        return trained or self.hf or self.summary

    def describe(self) -> str:
        """E.g. ``last complete checkpoint: step 600 (2 complete); metrics up to step 600; hf/
        (an exported model); summary.json``."""
        parts = []
        if self.checkpoints:
            parts.append(f"last complete checkpoint: step {self.checkpoints[-1]} ({len(self.checkpoints)} complete)")
        else:
            parts.append("no complete checkpoint")
        if self.metrics_last_step is not None:
            parts.append(f"metrics up to step {self.metrics_last_step}")
        if self.hf:
            parts.append("hf/ (an exported model)")
        if self.summary:
            parts.append("summary.json (a finished run)")
        return "; ".join(parts)

    def leftovers(self) -> list[Path]:
        """The runner outputs among :data:`LEFTOVERS` that are there and not empty, when
        ``workers.json`` shows a start got as far as writing them (else none: a directory of
        the user's own is left alone); ``checkpoints/`` only when it holds checkpoints alone."""
        if not (self.path / "workers.json").is_file():
            return []
        out = []
        for name in LEFTOVERS:
            p = self.path / name
            if name == "checkpoints" and p.is_dir() and not all(_CKPT_ENTRY.match(c.name) for c in p.iterdir()):
                continue
            if (p.is_dir() and any(p.iterdir())) or (p.is_file() and p.stat().st_size > 0):
                out.append(p)
        return out


def inspect_run_dir(run_dir: str | os.PathLike[str]) -> PreviousRun:
    """Read what ``run_dir`` holds; changes nothing."""
    path = Path(run_dir)
    if not path.exists():
        return PreviousRun(path, exists=False)
    if not path.is_dir():
        raise RunDirError(f"run directory {path} exists and is not a directory; nothing was changed")
    steps = [step for step, _ in complete_checkpoints(path / "checkpoints")]
    metric_steps = [r["step"] for r in read_metrics(path / "metrics.jsonl") if isinstance(r.get("step"), int)]
    hf = path / "hf"
    return PreviousRun(
        path, exists=True, checkpoints=tuple(sorted(steps)),
        metrics_last_step=max(metric_steps) if metric_steps else None,
        hf=hf.exists() and (not hf.is_dir() or any(hf.iterdir())),
        summary=(path / "summary.json").exists(),
    )


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... the first that does not exist."""
    out, i = path, 2
    while out.exists() or out.is_symlink():
        out, i = path.with_name(f"{path.name}-{i}"), i + 1
    return out


def move_aside(run_dir: str | os.PathLike[str]) -> Path:
    """Rename ``run_dir`` to the unused sibling ``<name>.replaced-<UTC time>``; returns it."""
    path = Path(run_dir)
    dest = _unused(path.with_name(f"{path.name}.replaced-{_utc_stamp()}"))
    os.rename(path, dest)
    return dest


def _spelling_hint(path: Path) -> str:
    """`` did you mean 'x'?`` naming a close sibling directory, or ``""``."""
    try:
        names = [p.name for p in path.parent.iterdir() if p.is_dir()]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1)
    return f" did you mean {close[0]!r}?" if close else ""


def _nothing_to_resume(previous: PreviousRun) -> str:
    if not previous.exists:
        return f"the directory does not exist (is the run name spelled right?{_spelling_hint(previous.path)})"
    return f"no complete checkpoint under {previous.path / 'checkpoints'}"


def _ways_out(previous: PreviousRun, words: Words, new_run_hint: Callable[[Path], str],
              offer_resume: bool) -> str:
    rows = []
    if offer_resume and previous.last_checkpoint is not None:
        rows.append((words.resume, f"continue it from its last complete checkpoint (step {previous.last_checkpoint})"))
    n = 2
    while previous.path.with_name(f"{previous.path.name}-{n}").exists():
        n += 1
    rows.append((new_run_hint(previous.path.with_name(f"{previous.path.name}-{n}")), "start a new run beside it"))
    aside = previous.path.with_name(f"{previous.path.name}.replaced-<UTC time>")
    rows.append((words.overwrite + ("" if offer_resume else f" (instead of {words.resume})"),
                 f"move it aside to {aside} (nothing is deleted) and start fresh"))
    width = max(len(flag) for flag, _ in rows)
    return "\n".join(f"  {flag.ljust(width)}  {what}" for flag, what in rows)


def check_flags(resume: bool | str, overwrite: bool, words: Words = CLI_WORDS) -> None:
    """Raise :class:`RunDirError` for ``resume`` with ``overwrite``; ``ValueError`` for a
    ``resume`` that is not ``False``, ``True`` or ``"required"``."""
    if resume not in (False, True, "required"):
        raise ValueError(f"resume must be False, True or 'required', got {resume!r}")
    if resume and overwrite:
        raise RunDirError(f"{words.resume} and {words.overwrite} exclude each other: {words.resume} continues the "
                          f"run in the run directory, {words.overwrite} moves it aside and starts fresh")


def claim_run_dir(run_dir: str | os.PathLike[str], resume: bool | str = False, overwrite: bool = False, *,
                  say: Callable[[str], None] = print, words: Words = CLI_WORDS,
                  new_run_hint: Callable[[Path], str] | None = None) -> PreviousRun:
    """Apply the module's rule to ``run_dir`` before a run uses it.

    Args:
        run_dir: the run directory (it may not exist).
        resume: ``False``, ``True`` (continue from the newest complete checkpoint, or start
            from step 0 when there is none) or ``"required"`` (there must be one).
        overwrite: move an earlier run aside instead of refusing.
        say: prints the one-line notices (nothing to resume, what was moved where).
        words: how messages name ``resume`` and ``overwrite`` (:data:`CLI_WORDS`, :data:`PYTHON_WORDS`).
        new_run_hint: the suggestion for a new run directory ``p`` (default ``run.name=<p.name>``).

    Returns what the directory held before anything was moved. Raises :class:`RunDirError`
    (nothing changed) where the rule refuses. Deletes nothing.
    """
    check_flags(resume, overwrite, words)
    hint = new_run_hint or (lambda p: f"run.name={p.name}")
    previous = inspect_run_dir(run_dir)
    if resume and previous.last_checkpoint is not None:
        return previous
    if resume:
        why = _nothing_to_resume(previous)
        if resume == "required":
            raise RunDirError(f"{words.required}: nothing to resume in {previous.path}: {why}. Nothing was changed.")
        if previous.is_run:
            raise RunDirError(
                f"{words.resume}: {previous.path} holds a run with no complete checkpoint to continue from "
                f"({previous.describe()}); starting it over from step 0 would replace it, so nothing was changed. "
                f"Choose one:\n{_ways_out(previous, words, hint, offer_resume=False)}")
        say(f"{words.resume}: nothing to resume in {previous.path}: {why}; starting from step 0 "
            f"({words.required} refuses instead)")
    elif previous.is_run:
        if not overwrite:
            raise RunDirError(
                f"{previous.path} already holds a run ({previous.describe()}); a fresh start would replace it, "
                f"so nothing was changed. Choose one:\n{_ways_out(previous, words, hint, offer_resume=True)}")
        dest = move_aside(previous.path)
        say(f"{words.overwrite}: moved the earlier run ({previous.describe()}) from {previous.path} to {dest}; "
            "starting fresh")
        return previous
    _set_aside_leftovers(previous, say)
    return previous


def _set_aside_leftovers(previous: PreviousRun, say: Callable[[str], None]) -> None:
    """Move what a start that trained no step left into ``earlier-starts/<UTC time>/``."""
    found = previous.leftovers() if previous.exists else []
    if not found:
        return
    dest = _unused(previous.path / EARLIER_STARTS / _utc_stamp())
    dest.mkdir(parents=True)
    for p in found:
        os.rename(p, dest / p.name)
    say(f"moved what an earlier start left before its first step ({', '.join(p.name for p in found)}) to {dest}")
