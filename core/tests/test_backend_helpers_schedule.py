"""Restoring an LR schedule on resume (:func:`rlweave.backend_helpers.schedule.restore_schedule`),
the one way every backend does it: the schedule continues where it stopped, and the optimizer's
learning rate is the schedule's even when the checkpoint did not hold the param groups."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from rlweave.backend_helpers.schedule import WarmupSchedule, restore_schedule, schedule_state  # noqa: E402


def _scheduled(lr: float = 0.1):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, WarmupSchedule(4, "cosine", 10, 0.1))


def test_a_restored_schedule_continues_with_the_same_learning_rates():
    opt, sched = _scheduled()
    for _ in range(3):
        opt.step()
        sched.step()
    state = json.loads(json.dumps(schedule_state(sched)))  # what a checkpoint holds: JSON values
    expected = []
    for _ in range(4):
        opt.step()
        sched.step()
        expected.append(opt.param_groups[0]["lr"])
    fresh_opt, fresh = _scheduled()  # param groups at the first step's learning rate
    restore_schedule(fresh, state)
    got = []
    for _ in range(4):
        fresh_opt.step()
        fresh.step()
        got.append(fresh_opt.param_groups[0]["lr"])
    assert got == expected


def test_restore_sets_the_param_groups_to_the_schedules_last_rate():
    opt, sched = _scheduled()
    for _ in range(2):
        opt.step()
        sched.step()
    state = schedule_state(sched)
    fresh_opt, fresh = _scheduled()
    assert fresh_opt.param_groups[0]["lr"] != opt.param_groups[0]["lr"]
    restore_schedule(fresh, state)
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_nothing_saved_or_no_schedule_is_a_no_op():
    opt, sched = _scheduled()
    before = opt.param_groups[0]["lr"]
    restore_schedule(sched, None)
    restore_schedule(None, {"last_epoch": 3})
    assert opt.param_groups[0]["lr"] == before and schedule_state(None) is None
