"""MLflow: one MLflow run per rlweave run, in the experiment ``logging.project``.

The tracking URI is ``logging.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the local
store ``file:<run_dir>/mlruns`` (MLflow's file store, in maintenance mode since MLflow 3: for a
``file:`` URI this module sets ``MLFLOW_ALLOW_FILE_STORE=true`` unless it is set already).
Metrics go through ``MlflowClient.log_batch`` (no process-wide active run). Key characters
MLflow refuses become ``_``. The file store keeps each metric in a file named after it, so
``time/generate`` and ``time/generate/dispatch`` cannot both exist there: with a ``file:`` URI
the ``/`` of metric names become ``.`` (``time.generate.dispatch``); other stores keep them. The MLflow run id is kept in ``loggers.json``, so a resumed run
continues the same MLflow run. The run ends ``FINISHED``, or ``FAILED`` when the run failed.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from rlweave.loggers import LoggerUnavailable, install_hint
from rlweave.loggers.base import BackendContext, MetricsBackend

_BAD_KEY_CHARS = re.compile(r"[^\w\-. /]")


def tracking_uri(ctx: BackendContext) -> str:
    """The URI this run logs to (see the module docstring)."""
    uri = getattr(ctx.settings, "tracking_uri", None) or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or (ctx.run_dir / "mlruns").resolve().as_uri()


class MlflowBackend(MetricsBackend):
    name = "mlflow"

    def __init__(self, client: Any, run_id: str, flat_names: bool = False) -> None:
        self._client = client
        self.run_id = run_id
        self._flat = flat_names

    def key(self, name: str) -> str:
        """The MLflow metric name of metric ``name`` (see the module docstring)."""
        name = _BAD_KEY_CHARS.sub("_", name)
        return name.replace("/", ".") if self._flat else name

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(self.key(k), float(v), now, int(step)) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def open(ctx: BackendContext) -> MlflowBackend:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise LoggerUnavailable(install_hint("mlflow")) from None
    uri = tracking_uri(ctx)
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    run_id = ctx.state.get("run_id") if ctx.resumed and ctx.state.get("tracking_uri") == uri else None
    if run_id:
        client.update_run(run_id, status="RUNNING")
    else:
        experiment = client.get_experiment_by_name(ctx.project)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(ctx.project)
        run = client.create_run(experiment_id, run_name=ctx.run_name, tags={"rlweave.run_dir": str(ctx.run_dir)})
        run_id = run.info.run_id
    ctx.state.clear()
    ctx.state.update({"run_id": run_id, "tracking_uri": uri, "experiment": ctx.project})
    return MlflowBackend(client, run_id, flat_names=uri.startswith("file:"))
