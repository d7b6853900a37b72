"""Workspace-wide test guards: every test module reaps the processes it starts, and leaves no
``torch.distributed`` process group initialised in the pytest process
(:func:`_no_leftover_process_group`).

After each test module, no descendant of the pytest process that appeared during the
module may remain, neither running nor as a zombie (a child that ended and was never
waited for: it makes ``psutil``'s ``cmdline()`` raise ``ZombieProcess`` in whoever lists
children next, as vLLM-engine tests once did). Engines, reward pools, Ray clusters
(``rlweave.scheduler.shutdown_ray``) and helpers must stop *and wait for* what they start.

Leftovers get ``GRACE_S`` seconds to go away on their own (Ray's processes and killed
workers exit asynchronously). Then running ones are killed, zombies are reaped (so the next
module starts clean), and the module errors at teardown, naming each leftover (pid, name,
state, command line) and the module. Exempt are the helpers Python and torch start once per
process and stop at exit (``SINGLETONS``), with their descendants.

With pytest-xdist (``make test`` runs two workers), each test module runs whole on one worker
(a ``xdist_group`` named after its file, so its module fixtures are built once), except that
every test using a fixture named in ``SHARED_FIXTURES`` joins that fixture's group, so the
expensive run or cluster behind it is built once per test run (``--dist loadgroup``; the group is
written into each node id here, see :func:`_tag_node_id`).

Ray clusters the tests start run their worker processes (the ranks among them) at niceness 0
(``RAY_worker_niceness``, unless set; Ray's own 15 elsewhere): with two test workers on two
cores, ranks at 15 are starved by the other worker's processes at 0 (bench/RESULTS.md, "The
test suite"). A test that checks Ray's default removes the variable.

``RLWEAVE_PROCESS_GUARD=warn`` reports leftovers as warnings instead; ``off`` disables the
check (default ``error``); ``RLWEAVE_PROCESS_GUARD_GRACE_S`` sets the grace period. Without
psutil the guard is off.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest

try:
    import psutil
except ImportError:  # pragma: no cover - psutil comes with vLLM and Ray
    psutil = None

GRACE_S = float(os.environ.get("RLWEAVE_PROCESS_GUARD_GRACE_S", "10"))
#: command-line markers of per-process helpers that live until the pytest process exits
SINGLETONS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "torch._inductor.compile_worker")
MODE_ENV = "RLWEAVE_PROCESS_GUARD"


RAY_NICENESS_ENV = "RAY_worker_niceness"


def pytest_configure(config):
    os.environ.setdefault(RAY_NICENESS_ENV, "0")  # inherited by the Ray clusters tests start (docstring)


def _descendants() -> dict[tuple[int, float], psutil.Process]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[(p.pid, p.create_time())] = p
        except psutil.Error:  # gone meanwhile
            pass
    return out


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # zombie or gone
        return ""


def _singleton_pids(procs) -> set[int]:
    """pids of the per-process helpers among ``procs`` and of their descendants."""
    out: set[int] = set()
    for p in procs:
        if any(marker in _cmdline(p) for marker in SINGLETONS):
            out.add(p.pid)
            try:
                out.update(c.pid for c in p.children(recursive=True))
            except psutil.Error:
                pass
    return out


def _describe(p: psutil.Process) -> str | None:
    """``pid N 'name' (state): cmdline``, or None when the process is gone."""
    try:
        name, state = p.name(), p.status()
    except psutil.Error:
        return None
    cmd = _cmdline(p)
    return f"pid {p.pid} {name!r} ({state})" + (f": {cmd[:300]}" if cmd else "")


def _leftovers(before: dict, deadline: float) -> list[psutil.Process]:
    """New descendants still present (running or zombie) once the grace period is over."""
    while True:
        now = _descendants()
        exempt = _singleton_pids(now.values())
        left = [p for key, p in now.items() if key not in before and p.pid not in exempt and _describe(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def _clean_up(procs: list[psutil.Process]) -> None:
    """Kill the running leftovers, then reap the zombies among this process's children."""
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)  # waits for (and reaps) this process's own children


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_processes(request):
    mode = os.environ.get(MODE_ENV, "error")
    if mode not in ("error", "warn", "off"):
        raise pytest.UsageError(f"{MODE_ENV}={mode!r}: choose error (default), warn or off")
    if psutil is None or mode == "off":
        yield
        return
    before = _descendants()
    yield
    left = _leftovers(before, time.monotonic() + GRACE_S)
    if not left:
        return
    lines = [d for d in map(_describe, left) if d]
    _clean_up(left)
    msg = (
        f"{request.node.nodeid} left {len(lines)} process(es) it started behind after {GRACE_S:g} s "
        f"(now killed and reaped); stop and wait for (join) every process a test starts:\n  " + "\n  ".join(lines)
    )
    if mode == "warn":
        warnings.warn(msg, stacklevel=1)
    else:
        pytest.fail(msg, pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_process_group(request):
    """A module must not leave ``torch.distributed``'s default process group initialised in
    the pytest process (a worker built in process joins one): the next module on this xdist
    worker could not form its own. Destroyed here, and the module errors naming itself
    (``RLWEAVE_PROCESS_GUARD=warn``: a warning; ``off``: not checked). Costs nothing where
    torch was never imported."""
    import sys

    yield
    mode = os.environ.get(MODE_ENV, "error")
    dist = sys.modules.get("torch.distributed")
    if mode == "off" or dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    dist.destroy_process_group()
    msg = (f"{request.node.nodeid} left torch.distributed's default process group initialised (now destroyed); "
           "shut down (worker.shutdown()) every worker a test builds in this process")
    if mode == "warn":
        warnings.warn(msg, stacklevel=1)
    else:
        pytest.fail(msg, pytrace=False)


#: session or package fixtures that build something expensive once (a trained run, the loopback
#: cluster of ``tests/multi_node``): the tests using one run on one xdist worker together
SHARED_FIXTURES = ("reference_run", "trained_run", "nodes")


def _group_of(item) -> str:
    """The ``xdist_group`` of a test: the name of the shared fixture it uses, else its file."""
    names = getattr(item, "fixturenames", ())
    return next((f for f in SHARED_FIXTURES if f in names), None) or item.nodeid.split("::", 1)[0]


def _marked_group(item) -> str:
    """The name in the test's ``xdist_group`` mark (as pytest-xdist reads it)."""
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def _tag_node_id(item, group: str) -> None:
    """Append ``@group`` to the test's node id, which is what ``--dist loadgroup`` schedules by.

    pytest-xdist 3.8 writes the suffix into ``item._nodeid``, which pytest 9.2's structured node
    ids no longer read (pytest-dev/pytest-xdist#1386): every test would be scheduled alone, and
    each module fixture built on both workers. So the suffix is written where this pytest keeps it."""
    if hasattr(item, "_id"):  # structured node ids (pytest >= 9.2); before them xdist's own hook does it
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook
def pytest_collection_modifyitems(config, items):
    """Give every test an ``xdist_group`` (:func:`_group_of`, unless it has one); under
    ``--dist loadgroup`` (an xdist worker) also tag its node id with that group and put the
    groups with a ``slow`` test first (they are handed out in this order)."""
    tag = bool(config.getoption("loadgroup", default=False))
    groups: dict[int, str] = {}  # id(item) -> its group
    slow: set[str] = set()
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group_of(item)))
        group = groups[id(item)] = _marked_group(item)
        if tag and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            _tag_node_id(item, group)
        if item.get_closest_marker("slow") is not None:
            slow.add(group)
    if tag:  # the groups holding whole runs first, so that no worker is left with one at the end
        items.sort(key=lambda item: groups[id(item)] not in slow)
