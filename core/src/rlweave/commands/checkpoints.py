"""Choosing a run's checkpoint for export, read-only: complete, and verified against its marker.

A run directory keeps its checkpoints in ``checkpoints/step_XXXXXX/`` (see
:mod:`rlweave.runner.checkpoint`): complete ones carry a ``COMPLETE`` marker listing every
file with its size and checksum; a save that did not finish leaves ``.tmp-step_XXXXXX/`` or a
``step_XXXXXX/`` without the marker. Nothing here writes, moves or deletes anything (unlike
:class:`~rlweave.runner.checkpoint.CheckpointManager`, whose constructor removes leftovers).
"""

from __future__ import annotations

from pathlib import Path

from rlweave.commands.errors import CommandError
from rlweave.runner.checkpoint import MARKER, CheckpointManager, complete_checkpoints


def complete_steps(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint of ``run_dir`` (unverified), oldest first."""
    return complete_checkpoints(Path(run_dir) / "checkpoints")


def _choices(found: list[tuple[int, Path]], run_dir: Path) -> str:
    if not found:
        return "there is no other complete checkpoint"
    steps = ", ".join(str(s) for s, _ in found)
    return f"complete checkpoints: steps {steps} (choose one with rlweave export {run_dir} --step N)"


def select_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The checkpoint to export: step ``step``, or the newest complete one.

    Raises :class:`CommandError` when there is none, when the chosen one is incomplete (no
    ``COMPLETE`` marker: its save did not finish), or when a file differs from what its
    marker lists (damaged, missing or added files). The newest one is never silently
    replaced by an older one: the message names the complete steps to choose from."""
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    if not root.is_dir():
        raise CommandError(f"{run_dir} has no checkpoints/ folder: not a run directory, or the run saved no "
                           "checkpoint yet")
    found = complete_steps(run_dir)
    if step is None:
        if not found:
            unfinished = sorted(p.name for p in root.iterdir() if p.is_dir())
            raise CommandError(f"no complete checkpoint in {root}" + (f" ({', '.join(unfinished)}: no {MARKER} "
                               "marker, their saves did not finish)" if unfinished else ""))
        step, path = found[-1]
    else:
        path = root / CheckpointManager.step_dir_name(step)
        unfinished = path.is_dir() or (root / f".tmp-{path.name}").is_dir()
        if unfinished and not CheckpointManager.is_complete(path):
            raise CommandError(f"checkpoint {path} is incomplete (no {MARKER} marker: its save did not finish); "
                               f"{_choices(found, run_dir)}")
        if not path.is_dir():
            raise CommandError(f"no checkpoint for step {step} in {root}; {_choices(found, run_dir)}")
    problems = CheckpointManager.verify(path)
    if problems:
        others = [(s, p) for s, p in found if s != step]
        raise CommandError(f"checkpoint {path} does not verify against its {MARKER} marker, so it is not used: "
                           f"{'; '.join(problems)}; {_choices(others, run_dir)}")
    return path
