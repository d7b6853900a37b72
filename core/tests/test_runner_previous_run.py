"""An earlier run is never deleted or overwritten without an explicit flag: the rule in
:mod:`rlweave.runner.previous_run`, and ``rlweave.runner.loop.run`` called from Python."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlweave.runner import previous_run
from rlweave.runner.previous_run import RunDirError, claim_run_dir, inspect_run_dir

_spec = importlib.util.spec_from_file_location("rlweave_test_run_dirs", Path(__file__).parent / "run_dir_fixtures.py")
run_dirs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_dirs)
make_run, fingerprint = run_dirs.make_run, run_dirs.fingerprint


@pytest.fixture
def cfg(tmp_path):
    """A valid GRPO config over the installed plugins whose model does not exist: a run that
    gets past the run directory fails at the tokenizer, before Ray or any worker."""
    from rlweave.config.loader import load_config

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({
        "run": {"name": "demo", "output_dir": str(tmp_path / "runs")},
        "model": {"path": str(tmp_path / "no-model")},
        "resources": {"pools": {"default": {"devices_per_node": 2}}},
        "roles": {"policy": {"backend": "fsdp", "optim": {"lr": 1e-3}}, "rollout": {"engine": "hf"}},
        "algorithm": {"name": "grpo"}, "rewards": [{"name": "arith_exact"}],
    }))
    return load_config(path, check_inputs=False)[0]


def test_what_counts_as_a_run(tmp_path):
    assert not inspect_run_dir(tmp_path / "missing").is_run
    leftovers = make_run(tmp_path / "a", checkpoints=(0,), metrics_to=0, hf=False, summary=False, partial=1)
    assert not inspect_run_dir(leftovers).is_run  # a start that trained no step
    assert inspect_run_dir(leftovers).last_checkpoint == 0  # ... can still be resumed from step 0
    for kw in ({"checkpoints": (3,), "metrics_to": None}, {"checkpoints": (), "metrics_to": 1},
               {"checkpoints": (), "metrics_to": None, "hf": True}, {"checkpoints": (), "metrics_to": None,
                                                                     "summary": True}):
        kw = {"hf": False, "summary": False, **kw}
        assert inspect_run_dir(make_run(tmp_path / str(len(list(tmp_path.iterdir()))), **kw)).is_run, kw


def test_a_directory_of_the_users_own_is_left_alone(tmp_path):
    """No run and no sign of an earlier start (``workers.json``): nothing is moved."""
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.mine").write_text("x")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "mine.pt").write_text("x")
    before, said = fingerprint(tmp_path), []
    claim_run_dir(tmp_path, say=said.append)
    (tmp_path / "workers.json").write_text("{}")  # a start wrote it: tensorboard/ is its, checkpoints/ is not
    claim_run_dir(tmp_path, say=said.append)
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "checkpoints" / "mine.pt").is_file()
    (aside,) = (tmp_path / "earlier-starts").iterdir()
    assert fingerprint(aside) == {"tensorboard/events.mine": before["tensorboard/events.mine"]}
    assert said == [f"moved what an earlier start left before its first step (tensorboard) to {aside}"]


def test_overwrite_twice_in_one_second_keeps_both(tmp_path, monkeypatch):
    monkeypatch.setattr(previous_run, "_utc_stamp", lambda: "20260101T000000Z")
    said = []
    for _ in range(2):
        make_run(tmp_path / "demo")
        claim_run_dir(tmp_path / "demo", overwrite=True, say=said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.replaced-20260101T000000Z",
                                                         "demo.replaced-20260101T000000Z-2"]
    assert said[1].endswith(f"to {tmp_path / 'demo.replaced-20260101T000000Z-2'}; starting fresh")


def test_run_refuses_a_directory_holding_a_run_before_touching_it(cfg, tmp_path):
    from rlweave.runner.loop import run

    earlier = make_run(tmp_path / "runs" / "demo")
    before = fingerprint(earlier)
    with pytest.raises(RunDirError) as err:
        run(cfg)
    text = str(err.value)
    assert text.startswith(f"{earlier} already holds a run (last complete checkpoint: step 4 (2 complete)")
    assert "resume=True " in text and "run.name=demo-2 " in text and "overwrite=True " in text
    assert fingerprint(earlier) == before
    with pytest.raises(RunDirError, match=r"resume=True and overwrite=True exclude each other"):
        run(cfg, resume=True, overwrite=True)
    assert fingerprint(earlier) == before
    other = make_run(tmp_path / "other")
    with pytest.raises(RunDirError, match=r"run_dir='.*other-2'"):  # an explicit run_dir: the hint names one
        run(cfg, run_dir=other)


def test_run_overwrite_moves_the_run_aside_and_never_deletes(cfg, tmp_path):
    from rlweave.runner.loop import run

    earlier = make_run(tmp_path / "runs" / "demo")
    before = fingerprint(earlier)
    with pytest.raises(Exception, match="no-model"):  # past the run directory: the missing model stops it
        run(cfg, overwrite=True)
    (moved,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("demo.replaced-")]
    assert fingerprint(moved) == before


def test_run_resume_with_nothing_to_resume(cfg, tmp_path, capsys):
    from rlweave.runner.loop import run

    with pytest.raises(RunDirError, match=r"resume='required': nothing to resume in .*demo: the directory does not"):
        run(cfg, resume="required")
    assert not (tmp_path / "runs" / "demo").exists()
    with pytest.raises(Exception, match="no-model"):
        run(cfg, resume=True)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"resume=True: nothing to resume in {tmp_path / 'runs' / 'demo'}: the directory does not "
                            "exist") and first.endswith("starting from step 0 (resume='required' refuses instead)")
