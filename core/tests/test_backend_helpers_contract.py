"""What :class:`rlweave.backend_helpers.training.TrainingSkeleton` declares a backend must
provide: a worker lacking any of it cannot be instantiated, and the error names what is missing."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from rlweave.backend_helpers.training import TrainingSkeleton  # noqa: E402
from rlweave.interfaces.worker import WorkerContext  # noqa: E402


class _Complete(TrainingSkeleton):
    backend = "complete"

    def init_model(self):
        pass

    def compute_logprobs(self, batch, temperature=1.0, with_entropy=False):
        return {}

    def named_weights(self):
        return iter(())

    def save_checkpoint(self, path):
        pass

    def load_checkpoint(self, path):
        pass

    def save_hf(self, path):
        pass

    def _plan(self, batch, budget):
        return []

    def _accumulate(self, batch, groups, n_micro, loss_fn, temperature, entropy):
        return 0.0, {}

    def _clip(self):
        return 0.0


def _without(name: str) -> type:
    """A subclass of :class:`_Complete` in which ``name`` is abstract again."""
    return type(f"No_{name.strip('_')}", (_Complete,), {name: TrainingSkeleton.__dict__[name]})


def test_a_complete_backend_instantiates():
    _Complete(WorkerContext())


@pytest.mark.parametrize("name", ["init_model", "compute_logprobs", "named_weights", "save_checkpoint",
                                  "load_checkpoint", "save_hf", "_plan", "_accumulate"])
def test_a_backend_missing_a_required_method_cannot_be_instantiated(name):
    with pytest.raises(TypeError, match=name):
        _without(name)(WorkerContext())


def test_a_backend_needs_clip_or_its_own_update():
    no_clip = type("NoClip", (_Complete,), {"_clip": TrainingSkeleton._clip})
    with pytest.raises(TypeError, match="neither _clip .* nor _update"):
        no_clip(WorkerContext())
    own_update = type("OwnUpdate", (no_clip,), {"_update": lambda self, loss_sum: (0.0, False)})
    own_update(WorkerContext())
