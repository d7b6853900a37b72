"""Reproducible runs: the checks of ``run.deterministic`` and ``rollout.replay``, and the header of
a rollout dump (``rollout.dump``).

A dump is the folder ``<run_dir>/rollouts/``: ``header.json`` (written before the first step) and
one ``step_XXXXXX.safetensors`` per step (:mod:`rlweave.algo_helpers.rollout_tape`). The header
names what the trajectories depend on, so that a replay of them into another model is refused
before any worker starts::

    {"format": 1, "algorithm": "grpo", "seed": 5,
     "model": {"path": "/models/tiny", "fingerprint": "<sha256>"},
     "tokenizer": {"path": "/models/tiny", "fingerprint": "<sha256>"}}

A fingerprint is a sha256 over the model directory's ``config.json``, its weight index
(``*.index.json``) and the name and size of each weight file (cheap for any model size: the
weights themselves are not read); a tokenizer's over its files. A path that is not a local
directory (a hub name during ``rlweave validate``) has no fingerprint and is compared by name.

Every check returns ``(key path, message)`` pairs for pass two (:mod:`rlweave.config.resolve`).
Light: no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

#: the dump's folder in a run directory, its header, and the name of step ``n``'s file
DUMP_DIR = "rollouts"
HEADER = "header.json"
FORMAT = 1
STEP_FILE = re.compile(r"^step_(\d{6})\.safetensors$")

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


def step_file(step: int) -> str:
    """The file name of step ``step`` (1-based) in a dump."""
    return f"step_{int(step):06d}.safetensors"


def _digest(entries: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in entries:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def model_fingerprint(path: str | None) -> str | None:
    """sha256 of a local model directory's config, weight index and weight file names and sizes
    (None when ``path`` is not a local directory)."""
    p = Path(path) if path else None
    if p is None or not p.is_dir():
        return None
    entries = []
    for f in sorted(p.iterdir()):
        if f.name == "config.json" or f.name.endswith(".index.json"):
            entries.append((f.name, f.read_bytes()))
        elif f.suffix in WEIGHT_SUFFIXES and f.is_file():
            entries.append((f.name, str(f.stat().st_size).encode()))
    return _digest(entries)


def tokenizer_fingerprint(path: str | None) -> str | None:
    """sha256 of a local tokenizer directory's files (None when not a local directory)."""
    p = Path(path) if path else None
    if p is None or not p.is_dir():
        return None
    return _digest([(n, (p / n).read_bytes()) for n in TOKENIZER_FILES if (p / n).is_file()])


def _policy_model(cfg: Any) -> Any:
    sec = cfg.roles.get("policy")
    return sec.model if sec is not None and sec.model is not None else cfg.model


def make_header(cfg: Any) -> dict[str, Any]:
    """The header of a dump written by a run of ``cfg`` (see the module docstring)."""
    m = _policy_model(cfg)
    tok = m.tokenizer or m.path
    return {"format": FORMAT, "algorithm": cfg.algorithm.name, "seed": int(cfg.run.seed),
            "model": {"path": m.path, "fingerprint": model_fingerprint(m.path)},
            "tokenizer": {"path": tok, "fingerprint": tokenizer_fingerprint(tok)}}


def write_header(run_dir: Path, cfg: Any) -> Path:
    """Create ``<run_dir>/rollouts/`` with its header; returns the folder."""
    folder = Path(run_dir) / DUMP_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (HEADER + ".tmp")
    tmp.write_text(json.dumps(make_header(cfg), indent=1))
    tmp.replace(folder / HEADER)
    return folder


def dump_folder(replay: str) -> Path | None:
    """The dump a ``rollout.replay`` value names (a run directory or its ``rollouts/``), or None."""
    p = Path(replay).expanduser()
    for folder in (p / DUMP_DIR, p):
        if (folder / HEADER).is_file():
            return folder
    return None


def dumped_steps(folder: Path) -> int:
    """Steps ``1..n`` a dump holds without a gap (``n``)."""
    have = {int(m.group(1)) for f in folder.iterdir() if (m := STEP_FILE.match(f.name))}
    n = 0
    while n + 1 in have:
        n += 1
    return n


def _same(kind: str, mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why the dump's ``theirs`` (model or tokenizer) is not ``mine``, or None."""
    a, b = mine.get("fingerprint"), (theirs or {}).get("fingerprint")
    if a and b:
        if a == b:
            return None
    elif str(mine.get("path")) == str((theirs or {}).get("path")):
        return None
    return (f"the dump was made with another {kind} ({(theirs or {}).get('path')!r}, fingerprint "
            f"{str(b)[:12]}) than this run's ({mine.get('path')!r}, fingerprint {str(a)[:12]})")


def replay_problems(cfg: Any, algorithm: str) -> list[tuple[str, str]]:
    """What keeps ``cfg`` from replaying ``rollout.replay`` (empty when it is off)."""
    replay = cfg.rollout.replay
    if not replay:
        return []
    key = "rollout.replay"
    out: list[tuple[str, str]] = []
    if cfg.run.mode != "sync":
        out.append(("run.mode", f"rollout.replay trains in run.mode sync only, not {cfg.run.mode!r}"))
    if cfg.rollout.partial is not None:
        out.append(("rollout.partial", "rollout.replay replays whole steps; remove rollout.partial"))
    if cfg.rollout.dump:
        out.append(("rollout.dump", "a replayed run generates nothing to dump; remove rollout.dump or rollout.replay"))
    folder = dump_folder(replay)
    if folder is None:
        return out + [(key, f"no rollout dump at {replay!r} (a run directory written with rollout.dump: true, or "
                            f"its {DUMP_DIR}/ folder holding {HEADER})")]
    try:
        header = json.loads((folder / HEADER).read_text())
    except (OSError, ValueError) as exc:
        return out + [(key, f"unreadable dump header {folder / HEADER}: {exc}")]
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return out + [(key, f"{folder / HEADER}: not a rollout dump of format {FORMAT}")]
    mine = make_header(cfg)
    for kind in ("model", "tokenizer"):
        why = _same(kind, mine[kind], header.get(kind))
        if why:
            out.append((key, why))
    if header.get("algorithm") != algorithm:
        out.append((key, f"the dump was made by algorithm {header.get('algorithm')!r}, this run is {algorithm!r}"))
    if header.get("seed") != mine["seed"]:
        out.append((key, f"the dump was made with run.seed {header.get('seed')}, this run has {mine['seed']}: the "
                         "data order and mini-batches would differ"))
    have = dumped_steps(folder)
    if have < cfg.run.total_steps:
        out.append(("run.total_steps", f"the dump at {str(folder)!r} holds steps 1..{have}; run.total_steps is "
                                       f"{cfg.run.total_steps}"))
    return out


def determinism_problems(cfg: Any, engine: Any) -> list[tuple[str, str]]:
    """The settings that keep a run with ``run.deterministic`` from being bitwise reproducible
    (empty when it is off); ``engine``: the rollout role's engine record (None: none started)."""
    if not cfg.run.deterministic:
        return []
    out: list[tuple[str, str]] = []
    why = "run.deterministic: true"
    if cfg.run.mode != "sync":
        out.append(("run.mode", f"{why} needs run.mode sync: in {cfg.run.mode!r} what a sample was generated with "
                                "depends on the timing of generation and training"))
    if cfg.rollout.partial is not None:
        out.append(("rollout.partial", f"{why} cannot hold with partial rollout: which samples a round finishes "
                                       "depends on timing; remove rollout.partial"))
    if engine is not None and not getattr(engine, "deterministic", False):
        out.append(("roles.rollout.engine", f"{why}: engine {engine.name!r} does not promise identical generations "
                                            "for one seed; use engine hf, or replay a dump (rollout.replay)"))
    return out
