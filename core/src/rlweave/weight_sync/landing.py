"""Rank side of every transport's receiving end: where the tensors land.

:func:`landing` wraps the receiving end's ``load_weights`` call. On an engine with a control
plane (``RolloutEngine.weights_landing``) the load runs between two decoding steps and the
engine takes the sync's ``version`` before it generates again; on any other worker the load
runs as it is and ``version`` is set afterwards when the worker has ``set_weight_version``.
A failed load sets no version.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def landing(worker: Any, version: int | None) -> Iterator[None]:
    """See the module docstring."""
    enter = getattr(worker, "weights_landing", None)
    if enter is not None:
        with enter(version):
            yield
        return
    yield
    stamp = getattr(worker, "set_weight_version", None)
    if version is not None and stamp is not None:
        stamp(version)
