"""CheckpointManager: atomic commit, crash mid-save, retention, per-file checksums with
fallback and refusal; the run loop's own checkpoint files (JSON RNG, no pickles)."""

import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import xxhash
from rlweave.runner.checkpoint import MARKER, CheckpointError, CheckpointManager, read_json, write_json
from rlweave.testing.tamper import flip_bytes, malicious_pickle, reseal


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


# ------------------------------------------------------------------ checksums in the marker
def _save_big(mgr, step, size=1 << 16):
    """A checkpoint with a nested shard of ``size`` pseudo-random bytes and a JSON file."""
    tmp = mgr.begin(step)
    (tmp / "roles" / "policy").mkdir(parents=True)
    (tmp / "roles" / "policy" / "shard.bin").write_bytes(random.Random(step).randbytes(size))
    write_json(tmp / "state.json", {"step": step})
    return mgr.commit(tmp, step)


def test_marker_lists_every_file_with_size_and_checksum(tmp_path):
    p = _save_big(CheckpointManager(tmp_path / "ckpt"), 4)
    marker = read_json(p / MARKER)
    assert marker["format"] == 1 and marker["step"] == 4
    assert sorted(marker["files"]) == ["roles/policy/shard.bin", "state.json"]
    for rel, entry in marker["files"].items():
        data = (p / rel).read_bytes()
        assert entry == {"size": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}
    assert CheckpointManager.verify(p) == []
    assert not (p / ".COMPLETE.tmp").exists()


@pytest.mark.parametrize("damage, words", [
    ("flip", "roles/policy/shard.bin: checksum mismatch"),
    ("truncate", "roles/policy/shard.bin: 65000 bytes"),
    ("delete", "roles/policy/shard.bin: missing"),
    ("add", "extra.pkl: not listed"),
])
def test_damaged_newest_falls_back_to_previous_with_a_warning(tmp_path, caplog, damage, words):
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=3)
    older, newer = _save_big(mgr, 2), _save_big(mgr, 4)
    shard = newer / "roles" / "policy" / "shard.bin"
    if damage == "flip":
        flip_bytes(shard, 64)
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:65000])
    elif damage == "delete":
        shard.unlink()
    else:
        (newer / "extra.pkl").write_bytes(b"\x80\x04N.")
    with caplog.at_level(logging.WARNING, logger="rlweave.checkpoint"):
        assert mgr.resumable() == older
    assert mgr.latest() == newer  # still complete, never loaded
    text = caplog.text
    assert "step_000004" in text and words in text and "falling back" in text


def test_no_verified_checkpoint_is_refused_naming_the_file(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt")
    p = _save_big(mgr, 4)
    flip_bytes(p / "roles" / "policy" / "shard.bin", 64)
    with pytest.raises(CheckpointError, match=r"step_000004: roles/policy/shard.bin: checksum mismatch"):
        mgr.resumable()
    assert CheckpointManager(tmp_path / "empty").resumable() is None  # nothing complete: a fresh start


def test_old_style_marker_is_unverifiable(tmp_path):
    """A marker without a file list (rlweave before checksums) is never trusted: older good
    checkpoints are used instead, and with none the error says why."""
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=3)
    good = _save_big(mgr, 2)
    old = _save_big(mgr, 4)
    (old / MARKER).write_text(json.dumps({"step": 4, "time": 0.0}))
    assert mgr.resumable() == good
    (good / MARKER).write_text(json.dumps({"step": 2, "time": 0.0}))
    with pytest.raises(CheckpointError, match="lists no files"):
        mgr.resumable()


def test_half_written_marker_leaves_the_checkpoint_incomplete(tmp_path):
    """The marker is written under a temporary name and renamed: a crash mid-write leaves a
    directory without ``COMPLETE``, removed by the next manager."""
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(root)
    good = _save_big(mgr, 1)
    tmp = mgr.begin(2)
    (tmp / "state.json").write_text("{}")
    os.rename(tmp, root / "step_000002")
    (root / "step_000002" / ".COMPLETE.tmp").write_text('{"format": 1, "fi')
    assert CheckpointManager(root).resumable() == good
    assert not (root / "step_000002").exists()


def test_resealed_marker_verifies_again(tmp_path):
    """Checksums catch damage, not intent (see rlweave.testing.tamper.reseal): the loaders
    are what refuse planted pickles."""
    mgr = CheckpointManager(tmp_path / "ckpt")
    p = _save_big(mgr, 1)
    (p / "rng.pkl").write_bytes(malicious_pickle(tmp_path / "never"))
    assert mgr.verify(p)
    reseal(p)
    assert mgr.verify(p) == [] and not (tmp_path / "never").exists()


# ------------------------------------------------------------------ the run loop's own files
class _Algo:
    def __init__(self):
        self.state = {"kl_coef": 0.25}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, st):
        self.state = dict(st)


def _loop_run(tmp_path, roles=None):
    from rlweave.runner.loop import _Run

    run = _Run.__new__(_Run)
    run.ckpt = CheckpointManager(tmp_path / "ckpt")
    run.trained = list(roles or {})
    run.roles = dict(roles or {})
    run.algo = _Algo()
    run.data_iter = None
    run.progress = None
    return run


def _draws():
    import numpy as np
    import torch

    return ([random.random(), random.gauss(0, 1)], np.random.rand(3).tolist() + [float(np.random.randn())],
            torch.rand(3).tolist() + torch.randn(2).tolist())


def test_controller_rng_is_json_and_a_resumed_stream_equals_the_uninterrupted_one(tmp_path):
    import numpy as np
    import torch

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    _draws()  # leaves a cached gauss in python and numpy
    run = _loop_run(tmp_path)
    path = run._save(7)
    assert not (path / "rng.pkl").exists()
    assert set(read_json(path / "rng.json")) == {"format", "python", "numpy", "tensors"}
    expected = [_draws() for _ in range(3)]  # the uninterrupted run
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    run.algo = _Algo()
    run.algo.state = {}
    assert run._load(path) == 7 and run.algo.state == {"kl_coef": 0.25}
    assert [_draws() for _ in range(3)] == expected


@pytest.mark.parametrize("where", ["legacy rng.pkl", "pickle as rng.json", "pickle as state.json"])
def test_controller_refuses_pickles_without_running_them(tmp_path, where):
    run = _loop_run(tmp_path)
    path = run._save(3)
    trap = tmp_path / "code-ran"
    if where == "legacy rng.pkl":
        (path / "rng.json").unlink()
        (path / "rng.pkl").write_bytes(malicious_pickle(trap))
        name, words = "rng.pkl", "holds the controller's RNG state as a pickle"
    else:
        name = where.split()[-1]
        (path / name).write_bytes(malicious_pickle(trap))
        words = "is a pickle, which is never loaded"
    with pytest.raises(CheckpointError) as info:
        run._load(path)
    assert name in str(info.value) and words in str(info.value)
    assert not trap.exists()


def test_a_role_refusing_its_checkpoint_becomes_a_checkpoint_error(tmp_path):
    from rlweave.worker_errors import WorkerError

    class _Failing:
        def result(self, timeout=None):
            raise WorkerError("policy", 1, "load_checkpoint", "CheckpointError: bad",
                              cause=CheckpointError("checkpoint file extra_rank1.pt holds ... as a pickle"))

    class _Role:
        def save_checkpoint(self, path):
            return _Done()

        def load_checkpoint(self, path):
            return _Failing()

    class _Done:
        def result(self, timeout=None):
            return None

    run = _loop_run(tmp_path, {"policy": _Role()})
    path = run._save(2)
    with pytest.raises(CheckpointError, match=r"role 'policy' rank 1: checkpoint file extra_rank1.pt"):
        run._load(path)
