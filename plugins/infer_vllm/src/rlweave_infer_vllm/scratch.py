"""A private folder for the files vLLM leaves in the temporary directory.

vLLM names its ZeroMQ sockets ``<VLLM_RPC_BASE_PATH>/<uuid>`` and its file rendezvous
``<tempdir>/vllm_dist_<hex>`` and removes neither. :func:`private_tmp` points both at a
folder of the engine's own while the engine starts (the processes it starts inherit the
setting); the engine removes the folder with :func:`remove` when it shuts down, so nothing
is left in the machine's temporary directory. The folder is named after the engine's process
(``rlweave-vllm-<pid>-...``): one left by a process that was killed is removed by the next
:func:`new_folder` on the machine (:func:`remove_stale`), or by whoever killed it
(:func:`folders_of`).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def private_tmp(folder: str) -> Iterator[None]:
    """While inside: ``TMPDIR``, :data:`tempfile.tempdir` and ``VLLM_RPC_BASE_PATH`` name
    ``folder``; ``TMPDIR`` and ``tempfile.tempdir`` are restored afterwards (vLLM keeps reading
    ``VLLM_RPC_BASE_PATH`` for the sockets it opens later, so that one stays). vLLM's cache of
    environment reads (frozen once an engine core has started in this process) is cleared
    first, so the new values are seen."""
    try:  # an earlier engine in this process may have frozen vLLM's environment reads: read them anew
        from vllm import envs

        getattr(envs, "disable_envs_cache", lambda: None)()
    except ImportError:
        pass
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = folder
    os.environ["VLLM_RPC_BASE_PATH"] = folder
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


PREFIX = "rlweave-vllm-"


def new_folder() -> str:
    """A fresh folder for this process under the machine's temporary directory (after
    :func:`remove_stale`)."""
    remove_stale()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def folders_of(pid: int) -> list[str]:
    """The folders process ``pid`` made with :func:`new_folder` that still exist."""
    return glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}{int(pid)}-*"))


def remove_stale() -> list[str]:
    """Remove the folders of processes that no longer exist; returns them."""
    gone = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*-*")):
        pid = os.path.basename(path)[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            remove(path)
            gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove(folder: str | None) -> None:
    """Remove ``folder`` and what vLLM left in it (missing: nothing to do)."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
