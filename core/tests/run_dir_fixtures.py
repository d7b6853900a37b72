"""Run directories as an earlier run leaves them, and a fingerprint that proves nothing changed.

Loaded by path (``importlib.util.spec_from_file_location``) from the tests that need it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def make_run(path: Path, checkpoints=(2, 4), metrics_to: int = 4, hf: bool = True, summary: bool = True,
             partial: int | None = None) -> Path:
    """A run directory with complete checkpoints at ``checkpoints``, metrics rows 0..``metrics_to``
    (none for ``None``), an exported ``hf/``, a ``summary.json`` and optionally a partial save."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.resolved.yaml").write_text("run: {name: earlier}\n")
    (path / "plugins.json").write_text("{}\n")
    ckpts = path / "checkpoints"
    ckpts.mkdir(exist_ok=True)
    for step in checkpoints:
        d = ckpts / f"step_{step:06d}"
        (d / "roles" / "policy").mkdir(parents=True)
        (d / "roles" / "policy" / "model.bin").write_bytes(step.to_bytes(4, "little") * 16)
        (d / "state.json").write_text(json.dumps({"step": step}))
        (d / "COMPLETE").write_text(json.dumps({"step": step}))
    if partial is not None:
        (ckpts / f".tmp-step_{partial:06d}").mkdir()
        (ckpts / f".tmp-step_{partial:06d}" / "state.json").write_text("{}")
    if metrics_to is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n"
                                                   for s in range(metrics_to + 1)))
        (path / "tensorboard").mkdir(exist_ok=True)
        (path / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\x00tb")
    if hf:
        (path / "hf").mkdir(exist_ok=True)
        (path / "hf" / "model.safetensors").write_bytes(b"weights-of-the-earlier-run")
        (path / "hf" / "config.json").write_text("{}")
    if summary:
        (path / "summary.json").write_text(json.dumps({"steps": metrics_to}))
    return path


def fingerprint(path: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``path``."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}
