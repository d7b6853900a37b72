"""Build a training backend's worker by its name, and read what one train step computed.

:func:`train_worker` is how every scenario gets its worker: the backend is looked up by the
name YAML uses (``roles.<role>.backend``) through the installed plugins, so a scenario written
once runs against any backend that understands its options.
"""

from __future__ import annotations

from typing import Any


def train_worker(backend: str, ctx_kw: dict, model: dict, optim: dict | None = None,
                 parallel: dict | None = None, **options: Any):
    """A built (``init_model`` called) worker of the training backend ``backend``, role
    ``policy``, seed 3, on the rank ``ctx_kw`` describes (the ``ctx_kwargs`` of
    :func:`~rlweave.testing.ranks.run_ranks`, optionally with ``kernels``): model section
    ``model``, optimizer section ``optim`` (none: a worker that does not train), parallel sizes
    ``parallel`` and backend options ``options``. An unknown or unavailable backend raises the
    plugin manager's error naming the choices."""
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.plugins.manager import get_plugin_manager

    worker_cls = get_plugin_manager().get("backend", backend).load()
    ctx = WorkerContext(role="policy", options=options, model=model, seed=3, parallel=dict(parallel or {}),
                        extra={"optim": optim} if optim else {}, **ctx_kw)
    w = worker_cls(ctx)
    w.init_model()
    return w


def full_grads(model) -> dict[str, Any]:
    """Every parameter's full gradient (gathered from its shards), on CPU; collective."""
    from torch.distributed.tensor import DTensor

    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone().cpu()
            for n, p in model.named_parameters() if p.grad is not None}


def train_step_with_grads(w, batch, loss) -> tuple[dict, dict[str, Any]]:
    """``(metrics, full gradients)`` of one ``train_step`` of worker ``w``, the gradients of
    ``w.model`` read just before ``w.optimizer`` applies them."""
    grads: dict = {}
    step = w.optimizer.step

    def capture(*a, **k):
        grads.update(full_grads(w.model))
        return step(*a, **k)

    w.optimizer.step = capture
    try:
        return w.train_step(batch, loss), grads
    finally:
        w.optimizer.step = step
