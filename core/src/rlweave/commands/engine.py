"""An inference engine plugin driven in this process (no Ray), for ``generate`` and ``eval``.

The engine is the same worker class a run's rollout role uses (``hf``, ``vllm``, ... from
their plugins), built with a one-rank :class:`~rlweave.interfaces.worker.WorkerContext`:
``init_engine()``, then ``generate()`` calls, then ``shutdown()`` (also on errors). Its
options are the run's ``roles.rollout.options`` when the run's rollout uses the same engine,
else the engine's defaults. The device is CUDA when torch sees one, else the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlweave.commands.errors import CommandError
from rlweave.commands.source import ModelSource, policy_model

DEFAULT_ENGINE = "hf"


def engine_choice(name: str | None, src: ModelSource, pm: Any) -> tuple[Any, Any]:
    """``(record, options)`` of the engine to use: ``name``, else the run's rollout engine, else
    ``hf``. Cheap (nothing heavy is imported); :class:`CommandError` for an unknown or unusable
    engine (naming the installed ones) or options it rejects."""
    from pydantic import ValidationError

    from rlweave.plugins.errors import PluginError

    rollout = src.cfg.roles.get("rollout") if src.cfg is not None else None
    from_run = not name and rollout is not None and bool(rollout.engine)
    where = f"{src.arg}: roles.rollout.engine" if from_run else "--engine"
    name = name or (rollout.engine if rollout is not None and rollout.engine else DEFAULT_ENGINE)
    try:
        record = pm.get("engine", name, where=where)
    except PluginError as exc:
        raise CommandError(str(exc)) from None
    options: dict[str, Any] = dict(rollout.options) if rollout is not None and rollout.engine == name else {}
    if record.config_model is not None:
        try:
            return record, record.config_model.model_validate(options)
        except ValidationError as exc:
            raise CommandError(f"{src.arg}: roles.rollout.options of engine {name!r}: " + "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    return record, options


@contextmanager
def local_engine(record: Any, options: Any, model_path: Path, src: ModelSource, dtype: str,
                 seed: int) -> Iterator[Any]:
    """A started engine of ``record`` on the Hugging Face directory ``model_path``; shut down on exit."""
    import torch

    from rlweave.interfaces.worker import WorkerContext

    section = policy_model(src)
    model = section.model_dump() if section is not None else {}
    model.update(path=str(model_path), dtype=dtype, model_type="causal_lm")
    ctx = WorkerContext(role="rollout", options=options, model=model, seed=seed,
                        device="cuda" if torch.cuda.is_available() else "cpu")
    engine = record.load()(ctx)
    try:
        engine.init_engine()
        yield engine
    finally:
        engine.shutdown()
