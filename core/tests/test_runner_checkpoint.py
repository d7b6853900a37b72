"""CheckpointManager: atomic commit, crash mid-save, retention."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rlweave.runner.checkpoint import MARKER, CheckpointManager, read_json, write_json


def _save(mgr, step, payload="x"):
    tmp = mgr.begin(step)
    assert tmp.name == f".tmp-step_{step:06d}"
    (tmp / "model.bin").write_text(payload)
    write_json(tmp / "state.json", {"step": step})
    return mgr.commit(tmp, step)


def test_commit_and_latest(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=3)
    assert mgr.latest() is None
    p = _save(mgr, 10)
    assert p.name == "step_000010" and (p / MARKER).is_file()
    assert read_json(p / "state.json") == {"step": 10}
    assert not (tmp_path / "ckpt" / ".tmp-step_000010").exists()
    assert mgr.latest() == p and CheckpointManager.step_of(p) == 10


def test_incomplete_checkpoints_are_invisible_and_cleaned(tmp_path):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(root, keep_last=2)
    good = _save(mgr, 5)
    # crash while writing: temp dir left behind
    tmp = mgr.begin(10)
    (tmp / "model.bin").write_text("half")
    # crash after rename, before the marker
    (root / "step_000020").mkdir()
    (root / "step_000020" / "model.bin").write_text("all but the marker")
    assert mgr.latest() == good
    mgr2 = CheckpointManager(root, keep_last=2)  # a resumed run
    assert mgr2.latest() == good
    assert sorted(p.name for p in root.iterdir()) == ["step_000005"]


def test_sigkill_during_save(tmp_path):
    root = tmp_path / "ckpt"
    _save(CheckpointManager(root), 1)
    script = textwrap.dedent(
        f"""
        import time
        from rlweave.runner.checkpoint import CheckpointManager
        mgr = CheckpointManager({str(root)!r})
        tmp = mgr.begin(2)
        (tmp / "started").write_text("1")
        with open(tmp / "model.bin", "w") as f:
            while True:
                f.write("x" * 4096); f.flush(); time.sleep(0.01)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 60
        while not (root / ".tmp-step_000002" / "started").exists():
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    mgr = CheckpointManager(root)
    assert mgr.latest() == root / "step_000001"
    assert not (root / ".tmp-step_000002").exists()


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_keeps_newest(tmp_path, keep):
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=keep)
    for step in range(1, 6):
        _save(mgr, step)
        assert mgr.latest().name == f"step_{step:06d}"
    assert [s for s, _ in mgr.complete()] == list(range(6 - keep, 6))


def test_retention_ignores_incomplete_and_never_deletes_only_complete(tmp_path):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(root, keep_last=1)
    _save(mgr, 1)
    (root / "step_000009").mkdir()  # newer but incomplete: does not count as a kept one
    assert mgr.apply_retention() == []
    assert mgr.latest().name == "step_000001"


def test_resave_same_step_replaces(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=2)
    _save(mgr, 3, "old")
    p = _save(mgr, 3, "new")
    assert (p / "model.bin").read_text() == "new" and mgr.latest() == p
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path / "c2", keep_last=0)
