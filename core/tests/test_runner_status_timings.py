"""The status line shows a step's phases; the parts of a phase stay in the metrics row only."""

from rlweave.runner.loop import _timings


def test_status_line_timings_keep_phases_only():
    m = {"time/generate": 0.2, "time/generate/wait": 0.19, "time/reward/pool": 0.01, "time/train_compute": 0.1,
         "loss": 1.0, "time/skipped": "n/a"}
    assert _timings(m) == {"generate": 0.2, "train_compute": 0.1}
