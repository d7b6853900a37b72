"""Metrics backends of a run, selected by ``logging.backends``.

Each optional backend is a small module here with an ``open(ctx)`` function returning a
:class:`~rlweave.loggers.base.MetricsBackend`; it imports its package only inside
``open``, so choosing none of the optional ones costs nothing. :data:`BACKENDS` is the table
the config validation and the runner share: name -> (module, pip package, import name).

``jsonl`` is always written (the run directory's own record: plots, ``summary.json`` and
resumes read it); listing it is optional. ``tensorboard`` warns and is skipped when neither
``torch.utils.tensorboard`` nor ``tensorboardX`` imports. ``wandb`` and ``mlflow`` are extras
of the core (``pip install 'rlweave[wandb]'`` / ``'rlweave[mlflow]'``); a selected one that is
not installed fails ``rlweave validate`` before any worker starts
(:func:`missing_packages`). Imports nothing heavy.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class BackendInfo:
    """One entry of :data:`BACKENDS`."""

    module: str | None  # None: written by MetricsLogger itself
    package: str | None  # what to pip install; None: nothing to install
    import_name: str | None  # what must import for the backend to work


BACKENDS: dict[str, BackendInfo] = {
    "jsonl": BackendInfo(None, None, None),
    "tensorboard": BackendInfo("rlweave.loggers.tensorboard", "tensorboard", None),
    "wandb": BackendInfo("rlweave.loggers.wandb", "wandb", "wandb"),
    "mlflow": BackendInfo("rlweave.loggers.mlflow", "mlflow-skinny", "mlflow"),
}


class LoggerUnavailable(RuntimeError):
    """A selected backend's package is not installed (one line naming the pip package)."""


def install_hint(name: str) -> str:
    """``logger 'wandb' needs the wandb package: pip install wandb (or 'rlweave[wandb]')``."""
    info = BACKENDS[name]
    return (f"logger '{name}' needs the {info.import_name} package, which is not installed: "
            f"pip install {info.package} (or pip install 'rlweave[{name}]')")


def missing_packages(names: list[str]) -> dict[str, str]:
    """Selected backends whose package does not import here: name -> :func:`install_hint`.
    Looks the package up without importing it."""
    out = {}
    for name in names:
        info = BACKENDS.get(name)
        if info is not None and info.import_name and not _importable(info.import_name):
            out[name] = install_hint(name)
    return out


def _importable(module: str) -> bool:
    if module in sys.modules:  # None there means imports of it are blocked
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None
