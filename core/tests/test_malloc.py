"""CPU processes keep freed memory for reuse (rlweave.scheduler.ray_impl.malloc)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from rlweave.scheduler.ray_impl import malloc

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")


def _faults(code: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    prog = f"from rlweave.scheduler.ray_impl import malloc\n{code}\nprint(malloc.realloc_page_faults())"
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


@glibc
def test_keep_freed_memory_removes_refaults_in_the_process_and_in_processes_started_with_the_settings():
    assert _faults("") > 4000  # glibc's defaults: the freed 64 MiB went back to the OS (32 MiB = 8,192 pages)
    assert _faults("assert malloc.keep_freed_memory()") < 500
    # a process started with the exported variable has the settings from its start
    env = {**{k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}, "GLIBC_TUNABLES": malloc.TUNABLES}
    out = subprocess.run([sys.executable, "-c", "from rlweave.scheduler.ray_impl import malloc; "
                          "print(malloc.realloc_page_faults())"], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) < 500


def test_start_env_only_for_cpu_ranks_and_never_over_a_users_setting(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert malloc.start_env(True, True) == {"GLIBC_TUNABLES": malloc.TUNABLES}
    assert malloc.start_env(True, False) == {} and malloc.start_env(False, True) == {}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert malloc.start_env(True, True) == {}


@glibc
def test_cpu_malloc_off_stops_exporting_what_it_exported(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(malloc, "_exported", False)
    malloc.cpu_malloc(True)
    assert os.environ["GLIBC_TUNABLES"] == malloc.TUNABLES
    malloc.cpu_malloc(False)
    assert "GLIBC_TUNABLES" not in os.environ
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")  # the user's: kept
    malloc.cpu_malloc(False)
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
