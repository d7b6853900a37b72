"""``rlweave export RUN_DIR [--step N] --out DIR [--role ROLE] [--overwrite]``.

``RUN_DIR`` may also be a GGUF file (or a directory holding exactly one): its Hugging Face
conversion (:mod:`rlweave.config.gguf`; from the cache, or made first) is copied to ``--out``.
A run whose model paths name GGUF files exports on their cached conversions.

Contract: the checkpoint (``--step``, default the newest complete one) must be complete and
verify against its ``COMPLETE`` marker (:mod:`rlweave.commands.checkpoints`), else exit 2
naming it. The role's own training backend plugin, as the run's ``config.resolved.yaml``
selects it, does the export through the worker contract, in this process on the CPU, without Ray: a
one-rank worker (``init_model`` on the run's base model, ``load_checkpoint(roles/<role>)``,
``save_hf``), so any backend that implements :class:`~rlweave.interfaces.backend.TrainingWorker`
exports (a checkpoint saved by several ranks is resharded to one on load). The tokenizer of
the run's model is saved beside the weights, as the run's own ``hf/`` export does, and
``rlweave_export.json`` records where the weights came from.

A role that trains LoRA adapters (``roles.<role>.lora``) is exported as a PEFT adapter directory
(``adapter_config.json``, ``adapter_model.safetensors``: ``PeftModel.from_pretrained(base, out)``
loads it; the worker's ``save_adapter``), or with ``--merge`` as a full Hugging Face model with
the adapters merged into the base weights.

The output appears whole or not at all: it is written to a hidden sibling directory and
renamed into place. An existing non-empty ``--out`` is refused unless ``--overwrite``, which
moves it aside to ``<out>.replaced-<UTC time>`` (never deleted), as ``rlweave train
--overwrite`` does with a run directory. Nothing in the run directory is changed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from rlweave.commands import plugins
from rlweave.commands.checkpoints import select_checkpoint
from rlweave.commands.errors import CommandError, user_errors
from rlweave.commands.run_config import RUN_CONFIG, load_run_config

INFO_FILE = "rlweave_export.json"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that is a file, or a non-empty directory without ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise CommandError(f"--out {out} exists and is not empty; choose another directory, or pass --overwrite "
                           f"to move it aside to {out.name}.replaced-<UTC time>")


def _worker_context(cfg: Any, role: str, record: Any) -> Any:
    """Rank 0 of a one-rank group of ``role``, without an optimizer (only weights are loaded)."""
    from rlweave.scheduler.contexts import worker_context

    ctx = worker_context(cfg, role, 0, ("127.0.0.1", _free_port()), record=record)
    return dataclasses.replace(ctx, world_size=1, parallel={}, optim=None, device="cpu")


def _role_section(cfg: Any, resolved: Any, role: str, checkpoint: Path, config: Path) -> tuple[Any, Any]:
    """``(record, model section)`` of ``role``; :class:`CommandError` when the checkpoint holds no
    state of it or its base model directory is missing."""
    saved = sorted(p.name for p in (checkpoint / "roles").iterdir()) if (checkpoint / "roles").is_dir() else []
    if role not in saved:
        raise CommandError(f"checkpoint {checkpoint} holds no state of role {role!r} (it holds: "
                           f"{', '.join(saved) or 'none'}); choose one with --role")
    section = cfg.roles.get(role)
    record = resolved.roles.get(role)
    if section is None or record is None or record.kind != "backend":
        raise CommandError(f"{config}: role {role!r} has no training backend (roles.{role}.backend)")
    model = section.model if section.model is not None else cfg.model
    if model is None or not model.path or not Path(model.path).exists():
        path = model.path if model is not None else None
        raise CommandError(f"{config}: the base model {path!r} of role {role!r} does not exist (the checkpoint holds "
                           "the trained weights; its architecture is read from there). Relative paths are read "
                           "from the current directory: run from where the run was started")
    return record, model


def _write_hf(record: Any, cfg: Any, role: str, checkpoint: Path, model: Any, dest: Path, adapter: bool = False) -> None:
    """The backend's worker: base model, then the checkpoint's weights, saved as HF into ``dest``
    (with ``adapter``: the LoRA adapter alone); then the run's tokenizer beside them."""
    from transformers import AutoTokenizer

    from rlweave.runner.checkpoint import CheckpointError

    worker = record.load()(_worker_context(cfg, role, record))
    try:
        worker.init_model()
        worker.load_checkpoint(str(checkpoint / "roles" / role))
        if adapter:
            worker.save_adapter(str(dest))
        else:
            worker.save_hf(str(dest))
    except CheckpointError as exc:  # a file in a form that is never loaded (e.g. a pickle)
        raise CommandError(f"checkpoint {checkpoint}: {exc}") from None
    finally:
        worker.shutdown()
    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer or model.path, trust_remote_code=model.trust_remote_code)
    tokenizer.save_pretrained(str(dest))


def _gguf_converted(cfg: Any, say: Callable[[str], None]) -> Any:
    """``cfg`` with its GGUF model paths replaced by their cached conversions (converted now if needed)."""
    from rlweave.config.gguf import GgufError
    from rlweave.config.gguf_convert import localize_gguf

    try:
        return localize_gguf(cfg, say)[0]
    except GgufError as exc:
        raise CommandError(f"{exc.key}: {exc}" if exc.key else str(exc)) from None


def export_gguf(gguf: Path, out: Path, overwrite: bool = False, say: Callable[[str], None] = print) -> Path:
    """Write the Hugging Face conversion of GGUF file ``gguf`` to ``out`` (whole or not at all;
    a non-empty ``out`` only with ``overwrite``, moved aside); returns ``out``."""
    from rlweave.config.gguf import GgufError
    from rlweave.config.gguf_convert import converted_dir

    check_out(out, overwrite)
    try:
        converted = converted_dir(gguf, say)
    except GgufError as exc:
        raise CommandError(str(exc)) from None
    def write(tmp: Path) -> dict[str, Any]:
        shutil.copytree(converted, tmp)
        return {"gguf": str(gguf.resolve()), "converted": str(converted), "format": "hf_model"}

    return _publish(out, write, say)


def _publish(out: Path, write: Callable[[Path], dict[str, Any]], say: Callable[[str], None]) -> Path:
    """``write(tmp)`` fills a temporary sibling of ``out`` and returns what :data:`INFO_FILE`
    records; then the earlier ``out`` (when not empty) is moved aside and the temporary folder
    becomes ``out``: whole or not at all (a failing ``write`` leaves ``out`` as it was)."""
    from rlweave.runner.previous_run import move_aside

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = write(tmp)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.is_dir() and any(out.iterdir()):
        say(f"moved the earlier {out} aside to {move_aside(out)}")
    elif out.is_dir():
        out.rmdir()
    tmp.rename(out)
    return out


def export_checkpoint(run_dir: Path, out: Path, step: int | None = None, role: str = "policy",
                      overwrite: bool = False, pm: Any = None, say: Callable[[str], None] = print,
                      merge: bool = False) -> Path:
    """Export checkpoint ``step`` (default: newest complete) of ``role`` in ``run_dir`` to the
    Hugging Face directory ``out`` (see the module docstring; ``merge``: a LoRA role's adapters
    merged into a full model instead of an adapter directory); returns ``out``. Raises
    :class:`CommandError` for every refusal, before anything is loaded or written."""
    from rlweave.runner.checkpoint import CheckpointManager

    run_dir, out = Path(run_dir), Path(out)
    config = run_dir / RUN_CONFIG
    if not config.is_file():
        raise CommandError(f"{run_dir} is not a run directory (no {RUN_CONFIG})")
    check_out(out, overwrite)
    checkpoint = select_checkpoint(run_dir, step)
    cfg, resolved = load_run_config(config, pm if pm is not None else plugins.plugin_manager())
    cfg = _gguf_converted(cfg, say)
    record, model = _role_section(cfg, resolved, role, checkpoint, config)
    adapter = cfg.roles[role].lora is not None and not merge

    def write(tmp: Path) -> dict[str, Any]:
        _write_hf(record, cfg, role, checkpoint, model, tmp, adapter=adapter)
        return {"run_dir": str(run_dir.resolve()), "checkpoint": checkpoint.name,
                "step": CheckpointManager.step_of(checkpoint), "role": role, "backend": record.name,
                "model_type": model.model_type, "format": "peft_adapter" if adapter else "hf_model"}

    return _publish(out, write, say)


def export(run_dir: Path = typer.Argument(..., metavar="RUN_DIR",
                                            help="Run directory (holds config.resolved.yaml and checkpoints/), or a "
                                                 ".gguf file to convert."),
           out: Path = typer.Option(..., "--out", help="Hugging Face directory to write (must not exist, or be "
                                                       "empty)."),
           step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest complete "
                                                                   "checkpoint)."),
           role: str = typer.Option("policy", "--role", help="Trained role to export: policy, critic or reward (any "
                                                             "role the checkpoint holds)."),
           overwrite: bool = typer.Option(False, "--overwrite", help="A non-empty --out is moved aside to "
                                                                     "<out>.replaced-<UTC time> (never deleted)."),
           merge: bool = typer.Option(False, "--merge", help="A role that trains LoRA adapters: write a full model "
                                                             "with the adapters merged (default: a PEFT adapter "
                                                             "directory). Other roles are full models anyway."),
           ) -> None:
    """Export a run's checkpoint (or a GGUF file's conversion) to a Hugging Face directory."""
    from rlweave.config.gguf import GgufError, gguf_file

    with user_errors():
        try:
            gguf = gguf_file(run_dir)
        except GgufError as exc:
            raise CommandError(str(exc)) from None
        if gguf is not None:
            path = export_gguf(gguf, out, overwrite=overwrite, say=typer.echo)
            typer.echo(f"exported the GGUF {gguf} as a Hugging Face model to {path}")
            return
        path = export_checkpoint(run_dir, out, step=step, role=role, overwrite=overwrite, say=typer.echo, merge=merge)
        info = json.loads((path / INFO_FILE).read_text(encoding="utf-8"))
    what = "LoRA adapter" if info["format"] == "peft_adapter" else info["model_type"]
    typer.echo(f"exported {info['role']} of {run_dir} step {info['step']} ({info['backend']} backend, "
               f"{what}) to {path}")
