"""What every training backend's multi-rank scenarios share.

A *scenario* is a module-level function ``scenario(ctx_kw, *args)`` that
:func:`rlweave.testing.ranks.run_ranks` runs on every rank: it builds the backend's worker
(:func:`train_worker`, by backend name, so the same scenario runs against FSDP, Megatron or a
third-party backend), drives it through the worker contract on the batches here, and returns
plain tensors and floats from rank 0 for the test to compare with the references here or with
another backend. A backend plugin keeps its own scenarios in its tests folder (loaded with
:func:`rlweave.testing.helper_modules.import_helper`) and builds them from these parts:

* :mod:`.batches`: :func:`fixed_batch`, :func:`group_batch`, :func:`shard_indices`,
  :func:`gather_by_sample`;
* :mod:`.losses`: :func:`nll_loss`, :func:`value_loss`, :class:`TemperedLogprobSum`,
  :class:`NaNOnRank`;
* :mod:`.reference`: single-process transformers references (:func:`reference_logprobs`,
  :func:`sample_logprobs`, :func:`reference_grad_norm`, :func:`reference_outputs`,
  :func:`reference_train_step`, :func:`reference_heads`);
* :mod:`.workers`: :func:`train_worker`, :func:`full_grads`, :func:`train_step_with_grads`;
* :mod:`.contract`: the scenarios of :class:`rlweave.testing.backend_contract.BackendContractSuite`.

Importing this package is light (torch and transformers are imported when a function runs).

Example, a scenario (in a helper beside the tests) and its test::

    # mybackend/tests/step_scenarios.py
    from rlweave.testing.scenarios import fixed_batch, nll_loss, shard_indices, train_worker

    def one_step(ctx_kw, model_dir):
        w = train_worker("mybackend", ctx_kw, {"path": model_dir}, {"lr": 1e-3})
        full = fixed_batch()
        shard = full.select(shard_indices(ctx_kw["world_size"], ctx_kw["rank"], len(full)))
        return w.train_step(shard, nll_loss)

    # mybackend/tests/test_step.py
    import math
    from pathlib import Path
    from rlweave.testing.helper_modules import import_helper
    from rlweave.testing.ranks import run_ranks
    from rlweave.testing.tiny_model import build_tiny_qwen2

    scenarios = import_helper(Path(__file__).with_name("step_scenarios.py"))

    def test_one_step_is_finite(tmp_path):
        metrics = run_ranks(scenarios.one_step, 2, str(build_tiny_qwen2(tmp_path / "model")))
        assert math.isfinite(metrics["loss"])
"""

from rlweave.testing.scenarios.batches import fixed_batch, gather_by_sample, group_batch, shard_indices
from rlweave.testing.scenarios.losses import TemperedLogprobSum, nll_loss, value_loss
from rlweave.testing.scenarios.reference import reference_grad_norm, reference_logprobs, sample_logprobs
from rlweave.testing.scenarios.workers import full_grads, train_step_with_grads, train_worker

__all__ = [
    "TemperedLogprobSum", "fixed_batch", "full_grads", "gather_by_sample", "group_batch", "nll_loss",
    "reference_grad_norm", "reference_logprobs", "sample_logprobs", "shard_indices", "train_step_with_grads",
    "train_worker", "value_loss",
]
