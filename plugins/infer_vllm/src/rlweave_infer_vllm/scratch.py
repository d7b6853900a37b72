"""A private folder for the files vLLM leaves in the temporary directory.

vLLM names its ZeroMQ sockets ``<VLLM_RPC_BASE_PATH>/<uuid>`` and its file rendezvous
``<tempdir>/vllm_dist_<hex>`` and removes neither. :func:`private_tmp` points both at a
folder of the engine's own while the engine starts (the processes it starts inherit the
setting); the engine removes the folder with :func:`remove` when it shuts down, so nothing
is left in the machine's temporary directory.
"""

from __future__ import annotations

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


def new_folder() -> str:
    """A fresh folder under the machine's temporary directory."""
    return tempfile.mkdtemp(prefix="rlweave-vllm-")


def remove(folder: str | None) -> None:
    """Remove ``folder`` and what vLLM left in it (missing: nothing to do)."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
