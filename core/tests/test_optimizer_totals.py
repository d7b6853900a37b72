"""The run's optimizer-step total per trained role (the length of a cosine schedule with
``optim.total_steps: null``): the algorithm's updates per step, handed to the ranks."""

from __future__ import annotations

from types import SimpleNamespace

from rlweave.config.schema import RunConfig
from rlweave.interfaces.algorithm import Algorithm
from rlweave.scheduler.ray_impl.build import worker_context


def test_updates_per_step_default_reads_epochs_and_mini_batches():
    assert Algorithm.optimizer_steps_per_step(SimpleNamespace(ppo_epochs=2, mini_batches=3), "policy") == 6
    assert Algorithm.optimizer_steps_per_step(SimpleNamespace(mini_batches=4), "policy") == 4
    assert Algorithm.optimizer_steps_per_step(SimpleNamespace(), "policy") == 1


def test_rank_context_carries_the_total():
    cfg = RunConfig.model_validate({
        "model": {"path": "/m"},
        "roles": {"policy": {"backend": "fsdp", "optim": {"lr": 1e-4, "schedule": "cosine"}}},
        "algorithm": {"name": "grpo"},
    })
    ctx = worker_context(cfg, "policy", 0, ("127.0.0.1", 1234), total_steps=600)
    assert ctx.optim_total_steps == 600 and ctx.optim.schedule == "cosine"
    assert worker_context(cfg, "policy", 0, ("127.0.0.1", 1234)).optim_total_steps is None


def test_trained_roles_and_worker_contexts_leave_out_roles_that_never_train():
    from rlweave.config.schema import RunConfig
    from rlweave.runner.loop import _trained_roles
    from rlweave.scheduler.ray_impl.build import worker_context

    cfg = RunConfig.model_validate({"roles": {"policy": {"backend": "fsdp", "optim": {"lr": 1e-4}},
                                              "reference": {"backend": "fsdp", "optim": {"lr": 1e-4}}}})
    assert _trained_roles(cfg, ["policy", "reference"]) == ["policy"]
    assert worker_context(cfg, "reference", 0, ("127.0.0.1", 1)).optim is None
    assert worker_context(cfg, "policy", 0, ("127.0.0.1", 1)).optim.lr == 1e-4
