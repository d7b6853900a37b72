"""Check that every rank sees the run directory the controller sees.

Ranks write checkpoints, Hugging Face exports and evaluation files into the run directory and
the controller reads them back, so on several nodes the directory must be on a filesystem every
node mounts. :func:`check_shared_run_dir` proves it at start, before any step: the controller
writes a token into ``<run_dir>/.fs-check/``, every rank of every role reads it and writes a
marker of its own beside it, and the controller reads every marker back. A rank that cannot
see the token, or whose marker the controller cannot see, fails the run with an error naming
role, rank and node (host name, and inside Ray the node's address and id: several Ray nodes
may share a host). The probe directory is removed afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Mapping

PROBE_DIR = ".fs-check"


class SharedFilesystemError(RuntimeError):
    """A rank does not share the run directory with the controller."""


def this_node() -> str:
    """This process's node for a message: host name, and inside Ray the node's address and id."""
    node = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        node += f" ({ray.util.get_node_ip_address()}, Ray node {ray.get_runtime_context().get_node_id()[:12]})"
    return node


def probe_end(worker: Any, rank: int, directory: str, role: str) -> dict[str, Any]:  # noqa: ARG001
    """Rank side: read the controller's token in ``directory`` and write ``<role>.<rank>``."""
    path = Path(directory)
    token_file = path / "controller"
    token = token_file.read_text() if token_file.is_file() else None
    node = this_node()
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{role}.{rank}").write_text(json.dumps({"token": token, "node": node}))
    except OSError as exc:
        return {"node": node, "token": token, "error": f"{type(exc).__name__}: {exc}"}
    return {"node": node, "token": token}


def check_shared_run_dir(run_dir: str | os.PathLike[str], roles: Mapping[str, Any], timeout_s: float = 120.0) -> None:
    """Raise :class:`SharedFilesystemError` unless every rank of ``roles`` (name -> role
    handle) sees ``run_dir`` as the controller does (see the module docstring)."""
    directory = Path(run_dir).resolve() / PROBE_DIR
    token = uuid.uuid4().hex
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "controller").write_text(token)
    try:
        problems = []
        for role, handle in roles.items():
            ranks = list(range(handle.world_size))
            answers = handle.submit_ranks("check_shared_run_dir", ranks, [((str(directory), role), {})] * len(ranks),
                                          list, fn=probe_end).result(timeout=timeout_s)
            for rank, answer in zip(ranks, answers):
                where = f"role {role!r} rank {rank} on node {answer.get('node')}"
                if answer.get("error"):
                    problems.append(f"{where} cannot write there ({answer['error']})")
                elif answer.get("token") != token:
                    problems.append(f"{where} does not see the controller's files there")
                elif not (directory / f"{role}.{rank}").is_file():
                    problems.append(f"the controller does not see the file {where} wrote there")
        if problems:
            raise SharedFilesystemError(
                f"run directory {Path(run_dir).resolve()} is not shared by every node: " + "; ".join(problems)
                + ". Ranks write checkpoints, Hugging Face exports and evaluation files there and the controller "
                "reads them: put run.output_dir on a filesystem every node mounts at the same path."
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
