"""Weights & Biases: one W&B run per rlweave run, files under ``<run_dir>/wandb``.

``wandb.init(project=logging.project, name=logging.run_name or run.name,
entity=logging.entity, dir=<run_dir>, config=<resolved config>)``. W&B's own environment
variables apply as usual: ``WANDB_MODE=offline`` writes the run locally only (upload it later
with ``wandb sync <run_dir>/wandb/offline-run-*``), ``WANDB_API_KEY`` logs in. The W&B run id
is kept in ``loggers.json``, so a resumed run continues the same W&B run (W&B drops rows for
steps it has already seen). Closing the backend finishes the W&B run and ends W&B's service
process (``wandb.teardown``).
"""

from __future__ import annotations

import json
from typing import Any

from rlweave.loggers import LoggerUnavailable, install_hint
from rlweave.loggers.base import BackendContext, MetricsBackend


class WandbBackend(MetricsBackend):
    name = "wandb"

    def __init__(self, run: Any) -> None:
        self._run = run

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=int(step))

    def close(self, failed: bool = False) -> None:
        import wandb

        self._run.finish(exit_code=1 if failed else 0)
        wandb.teardown()  # end W&B's service process: a run leaves no process behind


def open(ctx: BackendContext) -> WandbBackend:
    try:
        import wandb
    except ImportError:
        raise LoggerUnavailable(install_hint("wandb")) from None
    run_id = ctx.state.get("id") if ctx.resumed else None  # None: W&B makes a new id
    entity = getattr(ctx.settings, "entity", None)
    config = json.loads(json.dumps(ctx.config.model_dump(mode="json"))) if ctx.config is not None else None
    run = wandb.init(project=ctx.project, name=ctx.run_name, entity=entity, dir=str(ctx.run_dir), id=run_id,
                     resume="allow" if run_id else None, config=config, reinit="create_new")
    ctx.state.clear()
    ctx.state.update({"id": run.id, "project": ctx.project})
    return WandbBackend(run)
