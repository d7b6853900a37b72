"""The start-of-run check that every rank shares the run directory with the controller."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlweave.runner.shared_fs import PROBE_DIR, SharedFilesystemError, check_shared_run_dir
from rlweave.scheduler.handle import RoleHandle
from rlweave.scheduler.local import LocalWorkerGroup


class Idle:
    def __init__(self, ctx):
        self.ctx = ctx


class OtherNode:
    """A role handle whose rank ``rank`` sees ``elsewhere`` where the controller sees the run
    directory (another node's disk at the same path)."""

    def __init__(self, handle, rank, run_dir, elsewhere):
        self.h, self.rank, self.run_dir, self.elsewhere = handle, rank, str(run_dir), str(elsewhere)
        self.world_size = handle.world_size

    def submit_ranks(self, method, ranks, rank_args, combine, fn=None):
        moved = [((a[0].replace(self.run_dir, self.elsewhere),) + a[1:], k) if r == self.rank else (a, k)
                 for r, (a, k) in zip(ranks, rank_args)]
        return self.h.submit_ranks(method, ranks, moved, combine, fn=fn)


def roles():
    return {"policy": RoleHandle("policy", LocalWorkerGroup("policy", Idle, [0, 1])),
            "rollout": RoleHandle("rollout", LocalWorkerGroup("rollout", Idle, [0]))}


def test_shared_directory_passes_and_leaves_nothing(tmp_path):
    check_shared_run_dir(tmp_path / "run", roles())
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / PROBE_DIR).exists()


def test_a_rank_on_another_filesystem_is_named(tmp_path):
    rs = roles()
    rs["policy"] = OtherNode(rs["policy"], 1, tmp_path / "run", tmp_path / "node2")
    with pytest.raises(SharedFilesystemError) as ei:
        check_shared_run_dir(tmp_path / "run", rs)
    msg = str(ei.value)
    assert "role 'policy' rank 1" in msg and "does not see the controller's files" in msg
    assert "rank 0" not in msg and "rollout" not in msg and "run.output_dir" in msg
    assert not (tmp_path / "run" / PROBE_DIR).exists()


def test_a_rank_that_cannot_write_is_named(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    rs = roles()
    rs["rollout"] = OtherNode(rs["rollout"], 0, tmp_path / "run", blocked)
    with pytest.raises(SharedFilesystemError, match="role 'rollout' rank 0 .*(cannot write|does not see)"):
        check_shared_run_dir(tmp_path / "run", rs)
    assert Path(blocked).read_text() == "not a directory"
