"""The episode pipeline's order of work (``run.mode: one_step_off`` for controller-driven
rollouts), with a rollout and a weight sync that record what they see: the next step's run starts
before a step trains, every trajectory after the first step is one version old, no weight sync
happens while a run is under way, the records drawn ahead are its state, and a run's error
reaches the step."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from rlweave.algo_helpers.episode_pipeline import EpisodePipeline
from rlweave.interfaces.rollout import Rollout


class Recording(Rollout):
    """Runs take 50 ms; each records its records' ids and the version given."""

    def __init__(self, fail_on: str | None = None):
        self.runs: list[dict] = []
        self.busy = threading.Event()
        self.fail_on = fail_on

    def run(self, records, n, sampling, generate, version=0):
        self.busy.set()
        try:
            self.runs.append({"ids": [r["id"] for r in records], "version": version})
            time.sleep(0.05)
            if self.fail_on in [r["id"] for r in records]:
                raise RuntimeError(f"environment failed on {self.fail_on}")
            return [r["id"] for r in records]
        finally:
            self.busy.clear()


class Sync:
    """A weight sync that fails the test if it lands while a run is under way."""

    def __init__(self, rollout: Recording):
        self.rollout, self.versions = rollout, []

    def sync(self, src, dst, version=None):
        if self.rollout.busy.is_set():
            raise AssertionError("a weight sync met a running rollout")
        self.versions.append(version)
        return {"bytes": 10, "seconds": 0.001}


def make(total_steps: int = 3, fail_on: str | None = None):
    rollout = Recording(fail_on)
    batches = iter([[{"id": f"r{k}"}] for k in range(1, 10)])
    ctx = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(total_steps=total_steps, mode="one_step_off"),
                                                 data=SimpleNamespace(batch_size=1), rollout=SimpleNamespace(partial=None)),
                          next_records=lambda: next(batches), roles={"rollout": None}, weight_sync=Sync(rollout))
    return EpisodePipeline(ctx, rollout, n=2, lookahead=1), rollout, ctx


def steps(pipe: EpisodePipeline, first: int, count: int) -> list[tuple[list, dict, bool]]:
    """``count`` steps from ``first``: (trained ids, metrics, whether another run began while
    the step trained)."""
    out = []
    pipe.sync_weights(first)  # the algorithm's setup: the engine gets the policy's weights
    rollout = pipe.rollout
    for s in range(first, first + count):
        batch = pipe.next_batch([{"id": f"s{s}"}], s, lambda salt: None)
        runs = len(rollout.runs)
        # training: until the run started for the next step is seen (5 s at most; 0.1 s with none)
        deadline = time.monotonic() + (5.0 if pipe.running is not None else 0.1)
        while len(rollout.runs) == runs and time.monotonic() < deadline:
            time.sleep(0.005)
        out.append((batch, pipe.step_metrics(s), len(rollout.runs) > runs))
        pipe.sync_weights(s + 1)
    pipe.drain()
    return out


def test_the_next_run_overlaps_the_step_and_syncs_wait_for_runs():
    pipe, rollout, ctx = make()
    try:
        done = steps(pipe, 0, 3)
    finally:
        pipe.close()
    # step 0 trains its own records; the next batch (drawn ahead) is trained one step later
    assert [b for b, _, _ in done] == [["s0"], ["r1"], ["s1"]]
    assert [m["staleness/max"] for _, m, _ in done] == [0.0, 1.0, 1.0]
    # the runs of steps 1 and 2 ran while the step before them trained, with that step's weights
    assert [r["version"] for r in rollout.runs] == [0, 0, 1]
    assert [overlapped for _, _, overlapped in done] == [True, True, False]
    # each applied between runs; the last step starts no run, so the drain applies the newest weights
    # (version 2 was never needed)
    assert ctx.weight_sync.versions == [0, 1, 3]
    assert [m["sync_bytes"] for _, m, _ in done] == [10.0, 10.0, 0.0]
    assert pipe.state_dict() == {"records": [[{"id": "s2"}]]}  # drawn, not trained


def test_records_drawn_ahead_are_the_state_a_resumed_pipeline_trains_first():
    pipe, _, _ = make(total_steps=4)
    try:
        steps(pipe, 0, 2)
        saved = pipe.state_dict()
    finally:
        pipe.close()
    assert saved == {"records": [[{"id": "s1"}]]}
    again, rollout, _ = make(total_steps=4)
    try:
        again.load_state_dict(saved)
        (batch, metrics, _), = steps(again, 2, 1)
    finally:
        again.close()
    assert batch == ["s1"] and metrics["staleness/max"] == 0.0  # sampled again with the restored weights
    assert rollout.runs[0]["ids"] == ["s1"]


def test_an_error_in_a_run_reaches_the_step_that_trains_it():
    pipe, _, _ = make(fail_on="r1")
    try:
        pipe.next_batch([{"id": "s0"}], 0, lambda salt: None)
        pipe.sync_weights(1)
        with pytest.raises(RuntimeError, match="environment failed on r1"):
            pipe.next_batch([{"id": "s1"}], 1, lambda salt: None)
    finally:
        pipe.close()
