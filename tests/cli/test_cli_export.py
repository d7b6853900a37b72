"""``rlweave export``: a run's FSDP checkpoint to a Hugging Face directory, for real.

* the newest checkpoint exports (subprocess, the console entry) to a directory that
  transformers loads with its tokenizer, holding the run's final weights (equal to the run's
  own ``hf/``), not the base model's; ``--step 1`` exports the other checkpoint, and
  ``--overwrite`` moves the earlier export aside instead of deleting it;
* refusals are one line and exit code 2, and change nothing: an existing non-empty ``--out``,
  an incomplete checkpoint (no ``COMPLETE`` marker), a damaged one (a file differs from its
  marker), a step or role the run does not have, a folder that is not a run directory.
"""

from __future__ import annotations

import json
import shutil

from rlweave.testing.runs import cli_env, leftovers, run_cli


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _same(a, b) -> bool:
    return sorted(a) == sorted(b) and all(bool((a[k] == b[k]).all()) for k in a)


def test_export_newest_and_chosen_step(trained_run, tmp_path):
    run = trained_run.run_dir
    out = tmp_path / "export"
    rc, text, pids = run_cli(["export", str(run), "--out", str(out)], cli_env())
    assert rc == 0, text[-3000:]
    assert f"exported policy of {run} step 2 (fsdp backend, causal_lm) to {out}" in text
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("3+4=")["input_ids"] == AutoTokenizer.from_pretrained(trained_run.ws.model)("3+4=")["input_ids"]
    step2 = _weights(out)
    assert _same(step2, _weights(run / "hf"))  # the run's final weights ...
    assert not _same(step2, _weights(trained_run.ws.model))  # ... which training changed
    assert json.loads((out / "rlweave_export.json").read_text())["step"] == 2
    assert pids is not None and not leftovers(pids)

    rc, text, _ = run_cli(["export", str(run), "--step", "1", "--out", str(out), "--overwrite"], cli_env())
    assert rc == 0, text[-3000:]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("export.replaced-")]
    assert len(aside) == 1 and f"moved the earlier {out} aside to {aside[0]}" in text
    assert _same(_weights(aside[0]), step2)  # nothing was deleted
    step1 = _weights(out)
    assert not _same(step1, step2) and not _same(step1, _weights(trained_run.ws.model))
    assert not list(tmp_path.glob(".export*"))  # no temporary directory left


def test_refuses_an_existing_non_empty_out(cli, expect_error, trained_run, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    expect_error(cli("export", trained_run.run_dir, "--out", out), f"--out {out} exists and is not empty",
                 "--overwrite")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


def test_refuses_incomplete_and_damaged_checkpoints(cli, expect_error, trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run.run_dir, run)
    ckpts = run / "checkpoints"
    (ckpts / "step_000002" / "COMPLETE").unlink()  # the newest save did not finish
    expect_error(cli("export", run, "--step", 2, "--out", tmp_path / "a"),
                 f"checkpoint {ckpts / 'step_000002'} is incomplete (no COMPLETE marker", "steps 1")
    shard = next((ckpts / "step_000001" / "roles" / "policy").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))  # one flipped bit
    line = expect_error(cli("export", run, "--out", tmp_path / "b"),
                        f"checkpoint {ckpts / 'step_000001'} does not verify against its COMPLETE marker")
    assert shard.name in line
    (ckpts / "step_000001" / "COMPLETE").unlink()
    expect_error(cli("export", run, "--out", tmp_path / "c"), f"no complete checkpoint in {ckpts}",
                 "step_000001", "step_000002")
    assert not any((tmp_path / x).exists() for x in "abc")
    assert (ckpts / "step_000002").is_dir()  # nothing of the run was removed


def test_refuses_unknown_step_role_and_non_run_dirs(cli, expect_error, trained_run, tmp_path):
    run = trained_run.run_dir
    expect_error(cli("export", run, "--step", 7, "--out", tmp_path / "a"), "no checkpoint for step 7",
                 "complete checkpoints: steps 1, 2")
    expect_error(cli("export", run, "--role", "critic", "--out", tmp_path / "a"),
                 "holds no state of role 'critic' (it holds: policy)")
    expect_error(cli("export", trained_run.ws.model, "--out", tmp_path / "a"), "is not a run directory")
    assert not (tmp_path / "a").exists()
