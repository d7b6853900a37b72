"""The vLLM engine's scratch folder: named after its process, removed at shutdown, and a killed
process's folder removed by the next engine start."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from rlweave_infer_vllm import scratch


def test_folder_is_named_after_the_process_and_removed():
    path = scratch.new_folder()
    try:
        assert os.path.basename(path).startswith(f"{scratch.PREFIX}{os.getpid()}-") and os.path.isdir(path)
        assert path in scratch.folders_of(os.getpid())
        with scratch.private_tmp(path):
            assert tempfile.gettempdir() == path and os.environ["VLLM_RPC_BASE_PATH"] == path
        assert tempfile.gettempdir() != path
    finally:
        scratch.remove(path)
    assert not os.path.exists(path)


def test_a_dead_process_folder_is_removed_by_the_next_start_and_a_live_one_kept():
    code = "from rlweave_infer_vllm import scratch; print(scratch.new_folder())"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isdir(dead)  # its process has exited without removing it
    mine = scratch.new_folder()
    try:
        assert not os.path.exists(dead)
        assert os.path.isdir(mine)  # this process is alive: kept
    finally:
        scratch.remove(mine)
