"""bench/mismatch.py: the overrides of each row, and the summary and table it reads from a run
directory's ``metrics.jsonl`` as ``rlweave train`` writes it."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_mismatch_t", ROOT / "bench" / "mismatch.py")
mismatch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mismatch)


def test_only_the_matched_row_runs_the_engine_in_fp32_and_each_correction_is_named():
    assert mismatch.overrides("matched", "bfloat16") == ["roles.rollout.options.dtype=float32"]
    assert mismatch.overrides("none", "bfloat16") == ["roles.rollout.options.dtype=bfloat16"]
    for c in mismatch.CORRECTIONS:
        assert mismatch.overrides(c, "bfloat16") == ["roles.rollout.options.dtype=bfloat16",
                                                      f"algorithm.off_policy.correction={c}"]
    assert mismatch.overrides("r3", "bfloat16", "hf") == ["roles.rollout.engine=hf", "roles.rollout.options={}",
                                                         "roles.rollout.options.dtype=bfloat16",
                                                         "algorithm.router_replay=r3"]
    with pytest.raises(ValueError, match="unknown row"):
        mismatch.overrides("tis_typo", "bfloat16")
    assert mismatch.overrides("geo_mask:high=1.01:low=0.99", "bfloat16")[-1] == (
        "algorithm.off_policy.correction={name: geo_mask, high: 1.01, low: 0.99}")
    for bad, words in (("none:high=1.01", "only a correction"), ("geo_mask:high", "<option>=<value>")):
        with pytest.raises(ValueError, match=words):
            mismatch.overrides(bad, "bfloat16")


def test_summary_reads_evaluations_averages_and_peaks_of_the_mismatch_metrics_over_steps(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.30},
            {"step": 1, "mismatch/tokens": 10.0, "mismatch/k3": 1e-4, "mismatch/masked_frac": 0.0},
            {"step": 2, "mismatch/tokens": 10.0, "mismatch/k3": 3e-4, "mismatch/masked_frac": 0.5,
             "eval/accuracy": 0.50},
            {"step": 3, "mismatch/tokens": 10.0, "mismatch/k3": 2e-4, "mismatch/masked_frac": 0.25,
             "mismatch/dlogp_abs_max": 0.5, "eval/accuracy": 0.40}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = mismatch.summarize(tmp_path)
    assert (s["before"], s["final"], s["best"], s["best_step"], s["steps"]) == pytest.approx((30, 40, 50, 2, 3))
    assert s["k3"] == pytest.approx(2e-4)
    assert s["masked"] == pytest.approx(0.25)
    assert s["k1"] is None  # not logged: an empty cell, not a zero
    assert (s["k3_peak"], s["dlogp_max"]) == pytest.approx((3e-4, 0.5))  # the largest of any step
    assert s["routing_changed"] is None  # no router replay
    text = mismatch.table([{**s, "row": "none", "seed": 1, "fp32_final": 41.0, "wall_s": 12.0},
                           {"row": "icepop", "seed": 1, "wall_s": 3.0, "error": "exit 1"}])
    lines = text.splitlines()
    assert len({len(re.findall(r"(?<!\\)\|", line)) for line in lines}) == 1  # every row has every column
    assert "| none | 30.0% | 40.0% | 50.0% (2) | 41.0% |" in lines[2]
    assert "failed: exit 1" in lines[3]


def test_a_run_directory_the_bench_did_not_create_is_never_replaced(tmp_path):
    assert mismatch.check_run_dir(tmp_path / "absent") is False
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / mismatch.MARKER).write_text("{}")
    assert mismatch.check_run_dir(ours) is True
    with pytest.raises(SystemExit, match="did not create"):
        mismatch.check_run_dir(tmp_path)
    stopped = tmp_path / "stopped"  # a run the bench started and was stopped in: no marker yet
    stopped.mkdir()
    with pytest.raises(SystemExit, match="did not create"):
        mismatch.check_run_dir(stopped)
    (tmp_path / mismatch.LEDGER).write_text("other\nstopped\n")
    assert mismatch.check_run_dir(stopped) is True
