"""The pipeline contract: what feeds an RL algorithm's steps in a run mode.

A run mode (``run.mode``, a plugin kind: :class:`rlweave.plugins.RunModeRecord`) is one
:class:`Pipeline` plus the checks it needs of a run config. The algorithms' step toolkit
(:mod:`rlweave.algo_helpers.experience`) holds one pipeline for the whole run and calls it in
this order, on the controller:

* ``next_batch(records, steps_done, params)`` at the start of each step: the trajectories to
  train, one packed :class:`~rlweave.data.batch.Batch` in the layout of
  :meth:`rlweave.interfaces.rollout.Rollout.run` (fewer groups, or none, when the data ran out);
* ``wait(future, ...)`` / ``pump(...)`` whenever the step waits for a role call: a pipeline that
  keeps the engine generating while the trainers work merges finished requests and sends new
  ones here;
* ``sync_weights(version)`` at the end of a step that updated the policy (``version``: updates
  made so far); returns ``{"sync_bytes": ..., "time/sync": ...}`` of the sync done or begun;
* ``step_metrics(steps_done)`` last in every step: what it measured about the step's batch
  (staleness, queue, idle time of the roles, generation times...), merged into the step's row
  (a ``time/*`` key it reports replaces the toolkit's own of that name);
* ``drain(abort)`` before each evaluation and checkpoint and at the end of the run: every request
  in flight and every pending sync finished (their errors raised); ``abort`` when the run fails;
* ``state_dict()`` / ``load_state_dict()`` with the algorithm's checkpoint (JSON-able): records
  drawn and not yet trained are in it, so a resume neither loses nor repeats a record;
* ``close()`` once at the end of the run, failed or not.

``params(salt)`` returns the sampling settings of a generation started now (the toolkit's
per-step seeding); ``steps_done`` is the policy's version when the call is made.

Light: no torch at import time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch
    from rlweave.interfaces.engine import SamplingParams

#: ``params(salt) -> SamplingParams`` of a generation started now
Params = Callable[[int], "SamplingParams"]


class Pipeline(ABC):
    """Feeds an algorithm's steps (see the module docstring). Subclasses implement
    :meth:`next_batch` and :meth:`sync_weights`; the rest default to what a pipeline that leaves
    nothing running between calls needs."""

    @abstractmethod
    def next_batch(self, records: list[dict[str, Any]], steps_done: int, params: Params) -> Batch:
        """The trajectories the step trains (``records``: the step's own batch of data records)."""

    @abstractmethod
    def sync_weights(self, version: int) -> dict[str, float]:
        """Policy -> rollout after an update; ``{"sync_bytes", "time/sync"}`` of this call."""

    def step_metrics(self, steps_done: int) -> dict[str, float]:
        """What the pipeline measured about the last :meth:`next_batch`."""
        return {}

    def wait(self, future: Any, steps_done: int, params: Params) -> Any:
        """``future.result()``, feeding the engine meanwhile where the mode overlaps."""
        return future.result()

    def pump(self, steps_done: int, params: Params) -> None:
        """For a caller polling several futures itself: feed the engine once, without blocking."""

    def drain(self, abort: bool = False) -> None:
        """Finish (or with ``abort``, stop) what runs between steps, raising its error."""

    def close(self) -> None:
        """Release threads or workers the pipeline started."""

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state (JSON-able)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
