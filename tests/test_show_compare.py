"""``rlweave show`` and ``rlweave compare`` read back the shared reference run (4 GRPO steps):
what ran, its evaluations and metrics, its files; side by side with the same run cut at step 2
(a run that stopped), with the overlaid plot written once and never replaced without a flag."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from rlweave.cli import app


def _cut(run_dir, dest, steps):
    """A copy of ``run_dir`` as it stood after ``steps`` steps, unfinished (no summary.json)."""
    shutil.copytree(run_dir, dest)
    rows = [json.loads(line) for line in (dest / "metrics.jsonl").read_text().splitlines() if line.strip()]
    (dest / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= steps))
    (dest / "summary.json").unlink()
    return dest


def test_show_a_finished_run(reference_run):
    out = CliRunner().invoke(app, ["show", str(reference_run.run_dir)])
    assert out.exit_code == 0, out.output
    summary = json.loads((reference_run.run_dir / "summary.json").read_text())
    last = [json.loads(line) for line in (reference_run.run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert "finished: 4 steps" in out.output and "grpo | mode sync | policy fsdp, rollout hf" in out.output
    assert f"{last['reward/mean']:.4g}" in out.output  # the last step's reward, as logged
    if summary.get("eval_after"):
        assert f"{summary['eval_after']['eval/accuracy'] * 100:.1f}% after" in out.output
    assert str(reference_run.run_dir / "checkpoints") in out.output.replace("\n", "")


def test_compare_runs_side_by_side_and_never_replace_a_plot_silently(reference_run, tmp_path):
    stopped = _cut(reference_run.run_dir, tmp_path / "stopped-at-2", 2)
    plot = tmp_path / "cmp.png"
    args = ["compare", str(reference_run.run_dir), str(stopped), "--plot", str(plot)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    rows = {line.split("│")[1].strip(): line for line in out.output.splitlines() if line.count("│") > 3}
    assert rows["reference"].split("│")[2].strip() == "4" and rows["stopped-at-2"].split("│")[2].strip() == "2"
    assert plot.stat().st_size > 5000
    before = plot.read_bytes()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "exists; choose another --plot file or add --overwrite" in again.output
    assert plot.read_bytes() == before
    assert CliRunner().invoke(app, args + ["--overwrite"]).exit_code == 0


def test_a_path_that_is_not_a_run_is_one_line_and_exit_2(tmp_path):
    for cmd in (["show", str(tmp_path)], ["compare", str(tmp_path), str(tmp_path / "x")]):
        out = CliRunner().invoke(app, cmd)
        assert out.exit_code == 2 and out.output.strip().count("\n") == 0, out.output
        assert "not a run directory" in out.output
