"""Which model a ``CONFIG_OR_MODEL`` argument names, and the run config that comes with it.

The argument is one of:

* a **Hugging Face directory** (holds ``config.json``): used as it is;
* a **GGUF file** (``*.gguf``, or a directory holding exactly one and no ``config.json``): its
  conversion in the GGUF cache (:mod:`rlweave.config.gguf`), made first when there is none;
* a **run directory** (holds ``config.resolved.yaml``, written by ``rlweave train``);
* a **run config** (a YAML file): its run directory is ``<run.output_dir>/<run.name>``.

For a run, the model is the run's ``hf/`` export when it is at least as new as the newest
complete checkpoint (``summary.json``'s ``steps``), else the newest complete checkpoint,
verified and exported to a temporary directory through the backend plugin
(:func:`rlweave.commands.export.export_checkpoint`) and removed afterwards. A run that has
neither is an error. :func:`read_source` is cheap (no torch); :func:`model_dir` does the work.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlweave.commands.checkpoints import complete_steps
from rlweave.commands.errors import CommandError
from rlweave.commands.run_config import RUN_CONFIG, load_run_config


@dataclass
class ModelSource:
    """What :func:`read_source` found.

    Attributes:
        arg: the argument as given.
        hf_dir: the Hugging Face directory to load, or None when a checkpoint must be exported.
        run_dir: the run directory (None for a plain Hugging Face directory).
        step: the checkpoint step the model comes from, when known.
        gguf: the GGUF file to convert (then ``hf_dir`` is set by :func:`model_dir`).
        cfg / resolved: the run's config and plugin records (None for a plain directory).
    """

    arg: str
    hf_dir: Path | None = None
    run_dir: Path | None = None
    step: int | None = None
    cfg: Any = None
    resolved: Any = None
    gguf: Path | None = None

    def describe(self) -> str:
        """``runs/x/hf (step 3)``-style, for messages."""
        if self.gguf is not None:
            return f"{self.gguf} (GGUF" + (f", converted: {self.hf_dir})" if self.hf_dir is not None else ")")
        where = str(self.hf_dir) if self.hf_dir is not None else f"{self.run_dir} checkpoint"
        return where + (f" (step {self.step})" if self.step is not None else "")


def _hf_step(run_dir: Path) -> int | None:
    """The step of ``run_dir/hf``: ``summary.json``'s ``steps`` (None when unreadable)."""
    try:
        steps = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("steps")
    except (OSError, ValueError, AttributeError):
        return None
    return steps if isinstance(steps, int) else None


def _from_run(src: ModelSource) -> ModelSource:
    run_dir = Path(src.run_dir or ".")
    if not run_dir.is_dir():
        raise CommandError(f"{src.arg}: its run directory {run_dir} does not exist: train it first "
                           f"(rlweave train {src.arg}), or give a Hugging Face model directory")
    found = complete_steps(run_dir)
    hf = run_dir / "hf"
    hf_step = _hf_step(run_dir)
    if (hf / "config.json").is_file() and (not found or (hf_step is not None and hf_step >= found[-1][0])):
        src.hf_dir, src.step = hf, hf_step
    elif found:
        src.step = found[-1][0]
    else:
        raise CommandError(f"{run_dir} holds no model yet: no hf/ export and no complete checkpoint; train first, "
                           "or give a Hugging Face model directory")
    return src


def read_source(arg: Path, pm: Any) -> ModelSource:
    """Classify ``arg`` (see the module docstring). Raises :class:`CommandError` when it does not
    exist or is none of the three, and ``ConfigError`` for an invalid run config."""
    from rlweave.config.gguf import GgufError, gguf_file

    path = Path(arg)
    if not path.exists():
        raise CommandError(f"CONFIG_OR_MODEL {arg}: no such file or directory")
    try:
        gguf = gguf_file(path)
    except GgufError as exc:
        raise CommandError(f"CONFIG_OR_MODEL {exc}") from None
    if gguf is not None:
        return ModelSource(str(arg), gguf=gguf)
    if path.is_file():
        cfg, resolved = load_run_config(path, pm)
        run_dir = Path(cfg.run.output_dir) / cfg.run.name
        return _from_run(ModelSource(str(arg), run_dir=run_dir, cfg=cfg, resolved=resolved))
    if (path / RUN_CONFIG).is_file():
        cfg, resolved = load_run_config(path / RUN_CONFIG, pm)
        return _from_run(ModelSource(str(arg), run_dir=path, cfg=cfg, resolved=resolved))
    if (path / "config.json").is_file():
        return ModelSource(str(arg), hf_dir=path)
    raise CommandError(f"CONFIG_OR_MODEL {arg}: not a Hugging Face model directory (no config.json), a GGUF file, "
                       f"a run directory (no {RUN_CONFIG}) or a run config file")


def policy_model(src: ModelSource) -> Any:
    """The run's model section of the policy (``roles.policy.model``, else ``model``), or None."""
    if src.cfg is None:
        return None
    role = src.cfg.roles.get("policy")
    return role.model if role is not None and role.model is not None else src.cfg.model


def model_dtype(src: ModelSource, override: str | None) -> str:
    """``override``, else the run's policy ``model.dtype``, else ``float32``."""
    model = policy_model(src)
    return override or (model.dtype if model is not None else "float32")


@contextmanager
def model_dir(src: ModelSource, pm: Any, say: Callable[[str], None]) -> Iterator[Path]:
    """The Hugging Face directory of ``src``: its ``hf_dir``, its GGUF file's conversion (cached),
    or its newest complete checkpoint exported (verified) into a temporary directory that is
    removed on exit."""
    if src.gguf is not None and src.hf_dir is None:
        src.hf_dir = gguf_dir(src.gguf, say)
    if src.hf_dir is not None:
        yield src.hf_dir
        return
    from rlweave.commands.export import export_checkpoint

    with tempfile.TemporaryDirectory(prefix="rlweave-export-") as tmp:
        out = Path(tmp) / "hf"
        say(f"exporting checkpoint step {src.step} of {src.run_dir} to a temporary directory")
        export_checkpoint(src.run_dir, out, step=src.step, pm=pm)
        yield out


def gguf_dir(gguf: Path, say: Callable[[str], None]) -> Path:
    """The converted Hugging Face directory of GGUF file ``gguf`` (cached, or converted now);
    a file transformers cannot convert is a :class:`CommandError` naming it."""
    from rlweave.config.gguf import GgufError
    from rlweave.config.gguf_convert import converted_dir

    try:
        return converted_dir(gguf, say)
    except GgufError as exc:
        raise CommandError(str(exc)) from None


def chat_template(src: ModelSource) -> str | None:
    """The run's ``data.chat_template`` (a template or a file of one), when it sets one."""
    return getattr(src.cfg.data, "chat_template", None) if src.cfg is not None else None


def load_tokenizer(path: Path, src: ModelSource) -> Any:
    """The tokenizer saved with the model in ``path`` (else the run's ``model.tokenizer``)."""
    from transformers import AutoTokenizer

    model = policy_model(src)
    candidates = [path] + ([Path(model.tokenizer)] if model is not None and model.tokenizer else [])
    remote = bool(model is not None and model.trust_remote_code)
    problems = []
    for where in candidates:
        try:
            return AutoTokenizer.from_pretrained(str(where), trust_remote_code=remote)
        except (OSError, ValueError) as exc:
            problems.append(f"{where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    raise CommandError("no tokenizer could be loaded (" + "; ".join(problems) + ")")
